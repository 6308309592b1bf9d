// Command outbox migrates outbox tables, runs the relay, reports status and runs the
// demo. Every flag can also be set with an OUTBOX_* environment variable (--db is
// OUTBOX_DB, --poll-interval is OUTBOX_POLL_INTERVAL); a flag on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/internal/version"
)

// exitError carries an exit code; the message is printed as one line.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"migrate", "create or upgrade the outbox schema (--print shows the SQL)", runMigrate},
		{"relay", "publish committed events to a broker", runRelay},
		{"status", "show the backlog, the age of the oldest unpublished event and the dead letters", runStatus},
		{"dlq", "list, show, edit, replay or purge dead letters", runDLQ},
		{"retry", "make events waiting for a retry due now (once their destination is fixed)", runRetry},
		{"cleanup", "delete published rows older than the retention (the relay also does it)", runCleanup},
		{"ui", "serve the dashboard (backlog, flow, relays, dead letters, events) for a table", runUI},
		{"replay", "send published events again, in order, to rebuild or feed a consumer (docs/replay.md)", runReplay},
		{"verify", "write canary events and check they reach the broker, all, once, in order", runVerify},
		{"demo", "run the whole pattern on SQLite and an in-process NATS server", runDemo},
		{"version", "print the version, the VCS revision and the Go version of this binary", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	stopProfiles := startProfiles() // OUTBOX_CPUPROFILE and the others, if set
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	stopProfiles()
	if code != 0 {
		os.Exit(code)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 1 && args[0] == "help" {
		// `outbox help relay` (or `help dlq replay`): the command's own flags.
		return run(ctx, append(append([]string(nil), args[1:]...), "-h"), stdout, stderr)
	}
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = []string{"version"}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		if err == nil || errors.Is(err, flag.ErrHelp) {
			return 0
		}
		// One line (driver errors can span several), through the one redaction path:
		// a driver's or client's error can quote a DSN or a URL with its password.
		msg := redact.String(strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " "))
		msg = redact.Scrub(msg, secretsOf(args))
		fmt.Fprintf(stderr, "outbox %s: %s\n", c.name, msg)
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	fmt.Fprintf(stderr, "outbox: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

// runVersion prints what the binary knows of its build.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, version.Get())
	return nil
}

// buildInfo is the outbox_build_info metric: 1, labelled with the build's version,
// revision and Go version, so dashboards and alerts can tell which relay runs what.
func buildInfo() prometheus.Collector {
	v := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_build_info",
		Help:        "Always 1; the labels say which build of outbox this process runs.",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": v.Short(), "goversion": v.Go}})
	g.Set(1)
	return g
}

// secretsOf returns the passwords and secrets in the command line and the OUTBOX_*
// environment, so an error that quotes one in a form the redactor cannot recognise
// (a driver's parse error showing a piece of a URL) still never prints it.
func secretsOf(args []string) []string {
	var out []string
	for i, a := range args {
		out = append(out, redact.Passwords(a)...)
		if strings.HasPrefix(a, "--webhook-secret=") {
			out = append(out, strings.TrimPrefix(a, "--webhook-secret="))
		} else if (a == "--webhook-secret" || a == "-webhook-secret") && i+1 < len(args) {
			out = append(out, args[i+1])
		}
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OUTBOX_") {
			out = append(out, redact.Passwords(v)...)
			if k == "OUTBOX_WEBHOOK_SECRET" {
				out = append(out, v)
			}
		}
	}
	return out
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: outbox <command> [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `outbox <command> -h` for its flags. Every flag can be set as OUTBOX_<FLAG> in the environment.")
}

// newFlags returns a flag set whose defaults come from OUTBOX_* variables, applied by
// parse after all flags are defined.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("outbox "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// applyEnv sets every flag not given on the command line from its OUTBOX_* variable,
// or from the file its OUTBOX_*_FILE variable names (the container-secrets
// convention: OUTBOX_DB_FILE=/run/secrets/db keeps a password out of the environment
// and out of ps).
func applyEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if envErr != nil || set[f.Name] {
			return
		}
		key := envName(f.Name)
		v, ok := os.LookupEnv(key)
		if !ok {
			path, fromFile := os.LookupEnv(key + "_FILE")
			if !fromFile {
				return
			}
			s, err := readSecretFile(path, func(msg string) { fmt.Fprintf(fs.Output(), "outbox: warning: %s_FILE: %s\n", key, msg) })
			if err != nil {
				envErr = usageErr("%s_FILE: %v", key, err)
				return
			}
			key, v = key+"_FILE", s
		}
		if err := f.Value.Set(v); err != nil {
			envErr = usageErr("%s: %v", key, err) // not the value: it may be a secret
		}
	})
	return envErr
}

// secretFileMax bounds a secret file: a URL, a token or a key is far smaller, and a
// path mistaken for one (a log, a device) must not be read whole.
const secretFileMax = 64 << 10

// readSecretFile reads a secret from path, without its trailing line break. A file
// over secretFileMax is refused; one that other users may read (as ssh warns of a key)
// is read with a warning said by warn: mode 0600 or 0400, or 0440 with the group of
// the process (Kubernetes: the secret volume's defaultMode 0440 and the pod's fsGroup).
func readSecretFile(path string, warn func(string)) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return "", err
	}
	if info.Mode().Perm()&0o007 != 0 {
		warn(fmt.Sprintf("%s is readable by every user of the host (mode %04o): make it 0600, 0400, or 0440 with the process's group",
			path, info.Mode().Perm()))
	}
	b, err := io.ReadAll(io.LimitReader(f, secretFileMax+1))
	if err != nil {
		return "", err
	}
	if len(b) > secretFileMax {
		return "", fmt.Errorf("%s holds more than %d KiB: not a secret (a URL, a token or a key)", path, secretFileMax>>10)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// parse reads the command line, then OUTBOX_* variables for the flags it did not set.
func parse(fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return applyEnv(fs)
}

// parseFlags parses args into fs. The flag package would print a bad flag's error
// and then every flag's usage: the error is said once, in one line, by run, with where
// to find the flags; -h prints them.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		return err
	}
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("%w (`outbox help %s` lists the flags)", err, strings.TrimPrefix(fs.Name(), "outbox "))}
	}
	return nil
}
