package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/outboxd/outbox/cmd/outbox/internal/demo"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", stderr)
	dir := fs.String("dir", "", "folder for the demo's databases and NATS store (default: a temporary folder, removed afterwards)")
	duration := fs.Duration("duration", 10*time.Second, "how long the order service writes")
	rate := fs.Int("rate", 400, "orders per second to aim for")
	quiet := fs.Bool("quiet", false, "no progress bar")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *duration <= 0 || *rate <= 0 || *rate > 20000 {
		return usageErr("--duration must be positive and --rate 1..20000")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	workDir := *dir
	if workDir == "" {
		if workDir, err = os.MkdirTemp("", "outbox-demo-"); err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(workDir) }()
	} else if err := os.MkdirAll(workDir, 0o755); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "outbox demo: an order service writes orders and OrderPlaced events to SQLite in one\n"+
		"transaction (1 in 10 rolled back on purpose); relays publish them to NATS JetStream\n"+
		"(in this process); a billing service applies them through an inbox.\n\n")
	cfg := demo.Config{
		Dir: workDir, Duration: *duration, Rate: *rate,
		// The demo stops its relays itself, in order (SIGTERM, or a failpoint's kill).
		RelayCommand: func(args ...string) *exec.Cmd { return exec.Command(exe, append([]string{"relay"}, args...)...) }, //nolint:noctx // stopped by the demo, not by a context
	}
	tty := isTerminal(stderr)
	if !*quiet {
		var last time.Duration
		cfg.Progress = func(p demo.Progress) {
			switch {
			case tty:
				fmt.Fprint(stderr, "\r\033[K"+progressLine(p))
			case p.Elapsed-last >= 2*time.Second: // a log, not a bar
				last = p.Elapsed
				fmt.Fprintln(stderr, progressLine(p))
			}
		}
	}
	res, err := demo.Run(ctx, cfg)
	if !*quiet && tty {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return err
	}
	printSummary(stdout, res)
	if !res.OK() {
		return errors.New("a check failed (see the summary above)")
	}
	return nil
}

func progressLine(p demo.Progress) string {
	const width = 30
	done := min(width, int(float64(width)*p.Elapsed.Seconds()/p.Duration.Seconds()))
	return fmt.Sprintf("[%s%s] %4.1fs  written %d  published %d  consumed %d  (%s)",
		strings.Repeat("#", done), strings.Repeat(".", width-done), p.Elapsed.Seconds(),
		p.Written, p.Published, p.Consumed, p.Phase)
}

func printSummary(w io.Writer, r *demo.Result) {
	check := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAILED"
	}
	fmt.Fprintf(w, "orders committed          %6d   (each with its event, in the same transaction)\n", r.Written)
	fmt.Fprintf(w, "transactions rolled back  %6d   (their events were never published)\n", r.RolledBack)
	fmt.Fprintf(w, "events published          %6d\n", r.Published)
	fmt.Fprintf(w, "relay 1 killed (SIGKILL)  %6s   %s\n", map[bool]string{true: "yes", false: "no"}[r.KilledMidBatch],
		"after a batch reached the broker, before it was marked")
	fmt.Fprintf(w, "relay 2 took over in      %6s\n", r.Takeover.Round(time.Millisecond))
	fmt.Fprintf(w, "published again           %6d   (the killed relay's last batch; %d dropped by JetStream's Nats-Msg-Id dedup)\n", r.Republished, r.DroppedByBroker)
	fmt.Fprintf(w, "redeliveries skipped      %6d   (billing 'crashed' before acking; its inbox recognised them)\n", r.Redelivered)
	fmt.Fprintf(w, "events consumed           %6d\n", r.Consumed)
	fmt.Fprintf(w, "latency commit->consumed  p50 %s  p99 %s\n", r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond))
	fmt.Fprintf(w, "\nchecks: lost %d [%s]  phantoms %d [%s]  order violations %d [%s]  consumed = committed [%s]\n",
		r.Lost, check(r.Lost == 0), r.Phantoms, check(r.Phantoms == 0), r.OutOfOrder, check(r.OutOfOrder == 0),
		check(r.Consumed == r.Written))
}

// isTerminal reports whether w is a character device (a terminal), where a progress
// bar can redraw itself.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
