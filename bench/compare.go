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
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/outboxd/outbox/outboxdriver"
)

// compare runs, on the same PostgreSQL and NATS in one run, each outbox relay mode and
// Watermill's SQL forwarder: first the machine's ceilings (limits), then draining the
// same backlog (events/s, ratios to the ceilings and to Watermill, relay CPU per event,
// peak RSS), then under the same live load (commit to broker p50/p99, the most events
// waiting, relay CPU per event). -plot and -latency-plot write the charts
// docs/benchmarks.md shows.
func compare(dbURL, natsURL string, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ExitOnError)
	events := fs.Int("events", 200_000, "backlog size for each relay (0: no backlog runs)")
	plotPath := fs.String("plot", "", "write the throughput chart here (.svg or .png)")
	only := fs.String("only", "", "run only the relays whose label contains one of these, comma-separated")
	withLimits := fs.Bool("limits", true, "measure the machine's ceilings first (bench limits) and print each relay's rate as a fraction of them")
	cdcWrite := fs.String("cdc-write", "rows", "the CDC runs' write mode (the relay's, the peer's and the CDC ceiling's backlog): rows, or insert-delete (no rows left to mark, as the peer marks none)")
	live := liveOpts{conns: 8}
	fs.IntVar(&live.rate, "live-rate", 5000, "the live load's events per second (0: no live load)")
	fs.IntVar(&live.seconds, "live-seconds", 15, "how long the live load writes")
	fs.IntVar(&live.perTx, "live-per-tx", 5, "the live load's events per transaction")
	fs.IntVar(&live.published, "live-published", 0, "rows written and published before the live load and not vacuumed since, as in a table between two autovacuums")
	latencyPlot := fs.String("latency-plot", "", "write the live load's latency chart here (.svg or .png)")
	_ = fs.Parse(args)
	if *cdcWrite != string(outboxdriver.WriteRows) && *cdcWrite != string(outboxdriver.WriteInsertDelete) {
		return fmt.Errorf("compare: -cdc-write %q: want rows or insert-delete (the peer reads inserted rows)", *cdcWrite)
	}

	relays := []struct {
		label      string
		mode       string
		completion string
		wm         *wmTuning // a Watermill run
		peer       bool      // the thin CDC relay on pglogrepl (cdcpeer.go)
	}{
		{"outbox poll, mark (default)", "poll", "mark", nil, false},
		{"outbox poll, archive", "poll", "archive", nil, false},
		{"outbox poll, delete", "poll", "delete", nil, false},
		{"outbox cdc", "cdc", "", nil, false},
		{"CDC peer: a thin relay on pglogrepl", "cdc", "", nil, true},
		{"Watermill SQL forwarder, defaults", "poll", "", &wmTuning{}, false},
		{"Watermill SQL forwarder, tuned", "poll", "", &wmTuning{batch: 1000, deleteOnAck: true, ackAsync: true}, false},
	}
	machine := fmt.Sprintf("%d CPUs, %s", runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"))

	var c ceilings
	if *events > 0 && *withLimits {
		var err error
		if c, err = measureCeilings(dbURL, natsURL, *events, outboxdriver.WriteMode(*cdcWrite)); err != nil {
			return err
		}
	}
	if *events > 0 {
		base := drainOpts{events: *events, batch: 1000, perTx: 1000, mode: "poll", write: "rows", storage: "file"}
		var labels, modes []string
		var results []drainResult
		for _, c := range relays {
			if !picked(c.label, *only) {
				continue
			}
			fmt.Printf("== backlog: %s\n", c.label)
			var r drainResult
			var err error
			switch {
			case c.wm != nil:
				r, err = runWatermill(dbURL, natsURL, base, *c.wm)
			case c.peer:
				o := base
				o.write = *cdcWrite
				r, err = runCDCPeer(dbURL, natsURL, o)
			default:
				o := base
				o.mode, o.completion = c.mode, c.completion
				if c.mode == "cdc" {
					o.write = *cdcWrite
				}
				r, err = runDrain(dbURL, natsURL, o)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", c.label, err)
			}
			labels, modes, results = append(labels, c.label), append(modes, c.mode), append(results, r)
		}
		vsWM := func(r drainResult) string { return "-" }   // the tuned Watermill forwarder's, when it ran
		vsPeer := func(r drainResult) string { return "-" } // the CDC peer's, when it ran
		for i, l := range labels {
			if strings.Contains(l, "Watermill") && strings.Contains(l, "tuned") {
				wm := results[i].rate()
				vsWM = func(r drainResult) string { return fmt.Sprintf("%.1fx", r.rate()/wm) }
			}
			if strings.HasPrefix(l, "CDC peer") {
				peer := results[i]
				vsPeer = func(r drainResult) string {
					return fmt.Sprintf("%.2fx (CPU/event %.2fx)", r.rate()/peer.rate(), r.cpuPerEvent()/peer.cpuPerEvent())
				}
			}
		}
		fmt.Printf("\nBacklog: %d events, ~%d-byte payloads, 1,000 aggregates, written %s for the CDC runs; %s\n", *events, len(payload(0)), *cdcWrite, machine)
		fmt.Printf("| relay | events/s | vs Watermill (tuned) | vs the CDC peer | relay CPU µs/event | relay peak RSS |\n|---|---|---|---|---|---|\n")
		for i, r := range results {
			peer := "-"
			if modes[i] == "cdc" {
				peer = vsPeer(r)
			}
			fmt.Printf("| %s | %.0f | %s | %s | %.1f | %.0f MiB |\n", labels[i], r.rate(), vsWM(r), peer, r.cpuPerEvent(), r.rssMiB())
		}
		fmt.Printf("\n| relay | CPU µs/event: relay | PostgreSQL | nats-server | all three | %d CPUs busy |\n|---|---|---|---|---|---|\n", runtime.NumCPU())
		for i, r := range results {
			n := float64(r.events) / 1e6
			fmt.Printf("| %s | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", labels[i], r.cpuPerEvent(), r.pgCPU/n, r.natsCPU/n, r.allPerEvent(), 100*r.busy())
		}
		if *withLimits {
			printCeilings(c)
			fmt.Printf("\n| relay | events/s | of its database ceiling | of the broker ceiling | vs Watermill (tuned) |\n|---|---|---|---|---|\n")
			for i, r := range results {
				db := c.poll // Watermill's forwarder polls too
				if modes[i] == "cdc" {
					db = c.cdc
				}
				fmt.Printf("| %s | %.0f | %.0f%% of %s | %.0f%% | %s |\n", labels[i], r.rate(), 100*r.rate()/db.rate(), db.name[:strings.IndexByte(db.name, ':')],
					100*r.rate()/c.broker.rate(), vsWM(r))
			}
		}
		if *plotPath != "" {
			values := make(plotter.Values, len(results))
			for i, r := range results {
				values[i] = r.rate()
			}
			if err := barChart(*plotPath, fmt.Sprintf("Draining a %d-event backlog, PostgreSQL to NATS JetStream (%d CPUs)", *events, runtime.NumCPU()), labels, values); err != nil {
				return err
			}
		}
	}

	if live.rate <= 0 {
		return nil
	}
	var labels []string
	var results []liveResult
	for _, c := range relays {
		if !picked(c.label, *only) || c.peer { // the peer drains a backlog only
			continue
		}
		fmt.Printf("== live load: %s\n", c.label)
		o := live
		o.wm = c.wm
		o.mode, o.completion, o.write = c.mode, c.completion, "rows"
		r, err := runLive(dbURL, natsURL, o)
		if err != nil {
			return fmt.Errorf("%s: %w", c.label, err)
		}
		labels, results = append(labels, c.label), append(results, r)
	}
	fmt.Printf("\nLive load: %d events/s for %d s, %d per transaction, 8 producer connections; %s\n", live.rate, live.seconds, live.perTx, machine)
	if live.published > 0 {
		fmt.Printf("(poll modes: on a table holding %d rows published and not vacuumed since)\n", live.published)
	}
	fmt.Printf("| relay | committed events/s | p50 | p99 | max | most waiting | relay CPU µs/event |\n|---|---|---|---|---|---|---|\n")
	for i, r := range results {
		fmt.Printf("| %s | %.0f | %v | %v | %v | %d | %.1f |\n", labels[i], r.achieved, r.q(0.5), r.q(0.99), r.lat[len(r.lat)-1].Round(10*time.Microsecond), r.backlog, r.cpuPerEvent())
	}
	if *latencyPlot == "" {
		return nil
	}
	return latencyChart(*latencyPlot, fmt.Sprintf("Commit to broker under %d events/s, PostgreSQL to NATS JetStream (%d CPUs)", live.rate, runtime.NumCPU()), labels, results)
}

func shortLabel(s string) string {
	return strings.NewReplacer("outbox ", "", "SQL forwarder, ", "", " (default)", "").Replace(s)
}

func barChart(path, title string, labels []string, values plotter.Values) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "events/s"
	bars, err := plotter.NewBarChart(values, vg.Points(40))
	if err != nil {
		return err
	}
	bars.LineStyle.Width = vg.Length(0)
	p.Add(bars)
	names := make([]string, len(labels))
	for i, l := range labels {
		names[i] = shortLabel(l)
	}
	p.NominalX(names...)
	if err := p.Save(9*vg.Inch, 4*vg.Inch, path); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", path)
	return nil
}

// latencyChart draws each relay's latency distribution: the share of events that
// reached the broker within x ms (log scale), one line per relay.
// picked reports whether label contains one of only's comma-separated parts.
func picked(label, only string) bool {
	for part := range strings.SplitSeq(only, ",") {
		if strings.Contains(label, part) {
			return true
		}
	}
	return false
}

func latencyChart(path, title string, labels []string, results []liveResult) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "commit to broker, ms (log)"
	p.Y.Label.Text = "share of events"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = false, false
	var lines []any
	for i, r := range results {
		pts := make(plotter.XYs, 0, 200)
		for k := 0; k <= 200; k++ {
			q := float64(k) / 200
			ms := float64(r.lat[int(q*float64(len(r.lat)-1))].Microseconds())/1000 + 0.01
			pts = append(pts, plotter.XY{X: ms, Y: q})
		}
		lines = append(lines, shortLabel(labels[i]), pts)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return err
	}
	if err := p.Save(9*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", path)
	return nil
}
