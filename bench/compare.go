package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// compare drains the same backlog, on the same PostgreSQL and NATS, through each
// outbox relay mode and through Watermill's SQL forwarder, one after the other in
// one run, and prints the rates side by side (ratios against Watermill), the relay
// processes' CPU per event and peak RSS; -plot writes the throughput chart.
func compare(dbURL, natsURL string, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ExitOnError)
	events := fs.Int("events", 200_000, "backlog size for each relay")
	plotPath := fs.String("plot", "", "write the throughput chart here (.svg or .png)")
	only := fs.String("only", "", "run only the relays whose label contains this")
	_ = fs.Parse(args)
	base := drainOpts{events: *events, batch: 1000, perTx: 1000, mode: "poll", write: "rows", storage: "file"}
	type run struct {
		label string
		r     drainResult
	}
	var runs []run
	for _, c := range []struct {
		label string
		opts  func(o drainOpts) drainOpts
		wm    *wmTuning // a Watermill run
	}{
		{"outbox poll, mark (default)", func(o drainOpts) drainOpts { o.completion = "mark"; return o }, nil},
		{"outbox poll, archive", func(o drainOpts) drainOpts { o.completion = "archive"; return o }, nil},
		{"outbox poll, delete", func(o drainOpts) drainOpts { o.completion = "delete"; return o }, nil},
		{"outbox cdc", func(o drainOpts) drainOpts { o.mode = "cdc"; return o }, nil},
		{"Watermill SQL forwarder, defaults", nil, &wmTuning{}},
		{"Watermill SQL forwarder, tuned", nil, &wmTuning{batch: 1000, deleteOnAck: true, ackAsync: true}},
	} {
		if !strings.Contains(c.label, *only) {
			continue
		}
		fmt.Printf("== %s\n", c.label)
		var r drainResult
		var err error
		if c.wm != nil {
			r, err = runWatermill(dbURL, natsURL, base, *c.wm)
		} else {
			r, err = runDrain(dbURL, natsURL, c.opts(base))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", c.label, err)
		}
		runs = append(runs, run{c.label, r})
	}
	wm := runs[len(runs)-1].r.rate() // the tuned Watermill forwarder's, when it ran
	fmt.Printf("\n%d events, ~%d-byte payloads, 1,000 aggregates; %d CPUs, %s\n", *events, len(payload(0)), runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"))
	fmt.Printf("| relay | events/s | vs Watermill (tuned) | relay CPU µs/event | relay peak RSS |\n|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Printf("| %s | %.0f | %.1fx | %.1f | %.0f MiB |\n", r.label, r.r.rate(), r.r.rate()/wm, r.r.cpuPerEvent(), r.r.rssMiB())
	}
	if *plotPath == "" {
		return nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Draining a %d-event backlog, PostgreSQL to NATS JetStream (%d CPUs)", *events, runtime.NumCPU())
	p.Y.Label.Text = "events/s"
	values := make(plotter.Values, len(runs))
	names := make([]string, len(runs))
	for i, r := range runs {
		values[i] = r.r.rate()
		names[i] = strings.NewReplacer("outbox ", "", "SQL forwarder, ", "", " (default)", "").Replace(r.label)
	}
	bars, err := plotter.NewBarChart(values, vg.Points(40))
	if err != nil {
		return err
	}
	bars.LineStyle.Width = vg.Length(0)
	p.Add(bars)
	p.NominalX(names...)
	if err := p.Save(9*vg.Inch, 4*vg.Inch, *plotPath); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", *plotPath)
	return nil
}
