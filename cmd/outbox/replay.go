package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/human"
	"github.com/outboxd/outbox/replay"
)

// runReplay sends already-published events again (docs/replay.md).
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", stderr)
	dsn, tableName := dbTableFlags(fs, "database URL: postgres://user@host:5432/db (replay reads PostgreSQL's history)")
	brokerURL := fs.String("broker", "", "the broker to send to, as the relay's --broker")
	bo := brokerFlags(fs)
	topic := fs.String("topic-template", "", "the destination (default: the relay's default for the broker); another one feeds one consumer without disturbing the others")
	format := fs.String("format", "outbox", "wire format: outbox or cloudevents, as the relay's --format")
	ceMode := fs.String("cloudevents-mode", string(cloudevents.Binary), "with --format cloudevents: binary or structured")
	ceSource := fs.String("cloudevents-source", "", "with --format cloudevents: the source attribute (default /outbox/<schema>.<table>)")
	name := fs.String("name", "default", "the replay's name: its checkpoint (an interrupted replay of a name continues where it stopped) and its lock (one at a time)")
	since := fs.String("since", "", "only events published at or after this: RFC 3339 (2026-11-30T00:00:00Z) or a duration ago (24h)")
	until := fs.String("until", "", "only events published before this: RFC 3339 or a duration ago")
	byCreation := fs.Bool("by-creation-time", false, "--since and --until bound the write time instead of the publication time")
	var f replay.Filter
	fs.StringVar(&f.AggregateType, "aggregate-type", "", "only events of this aggregate type")
	fs.StringVar(&f.AggregateID, "aggregate-id", "", "only events of this aggregate id")
	fs.StringVar(&f.Type, "type", "", "only events of this event type")
	rate := fs.Float64("rate", 0, "most events sent per second (0: no bound)")
	batch := fs.Int("batch", replay.BatchDefault, "events read and published at once")
	dryRun := fs.Bool("dry-run", false, "count what would be sent, per topic, and send nothing")
	restart := fs.Bool("restart", false, "start the named replay over instead of continuing it")
	if err := parse(fs, args); err != nil {
		return err
	}
	now := time.Now()
	var err error
	if f.Since, err = replay.ParseWhen(*since, now); err != nil {
		return usageErr("--since: %v", err)
	}
	if f.Until, err = replay.ParseWhen(*until, now); err != nil {
		return usageErr("--until: %v", err)
	}
	f.ByCreation = *byCreation
	switch {
	case *dsn == "":
		return usageErr("--db is required")
	case !strings.HasPrefix(*dsn, "postgres://") && !strings.HasPrefix(*dsn, "postgresql://"):
		return usageErr("--db: replay reads the history PostgreSQL keeps (mark and archive completion); want postgres://")
	case *rate < 0 || *batch <= 0:
		return usageErr("--rate must not be negative and --batch must be positive")
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since):
		return usageErr("--until must be after --since")
	case *format != "outbox" && *format != "cloudevents":
		return usageErr("--format %q: want outbox or cloudevents", *format)
	}
	table, err := parseTable(*tableName, "json")
	if err != nil {
		return err
	}
	var scheme string // a dry run needs no broker
	if *brokerURL != "" || !*dryRun {
		if scheme, err = brokerScheme(*brokerURL, *bo); err != nil {
			return err
		}
	}
	if *topic == "" {
		*topic = defaultTopicTemplate(scheme)
	}
	tmpl, err := broker.ParseTemplate(*topic)
	if err != nil {
		return usageErr("--topic-template: %v", err)
	}
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return usageErr("--db: %v", err)
	}
	defer pool.Close()
	r := replay.New(pool, table)
	if *dryRun {
		counts, err := r.DryRun(ctx, &f, tmpl)
		if err != nil {
			return err
		}
		var n int64
		for _, t := range slices.Sorted(maps.Keys(counts)) {
			fmt.Fprintf(stdout, "%s\t%d\n", termSafe(t), counts[t])
			n += counts[t]
		}
		fmt.Fprintf(stdout, "would send %d events (%s) from %s; nothing sent\n", n, f.String(), table)
		return nil
	}
	logger, err := newLogger(stderr, "info", "text")
	if err != nil {
		return err
	}
	cfg := &replay.Config{Name: *name, Filter: f, Topic: tmpl, Rate: *rate, Batch: *batch, Restart: *restart, Logger: logger}
	if cfg.Router, err = newWireFormat(*format, *ceMode, *ceSource, scheme, tmpl, nil).router(table, nil); err != nil {
		return usageErr("%v", err)
	}
	bo.logger = cfg.Logger
	pub, err := openBroker(ctx, *brokerURL, *bo)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	last := time.Time{}
	cfg.Progress = func(p replay.Progress) {
		if time.Since(last) < time.Second && p.Sent < p.Total {
			return
		}
		last = time.Now()
		fmt.Fprintf(stderr, "replay %s: %d of %d sent (%.0f/s), about %s left\n", *name, p.Sent, p.Total,
			float64(p.Sent)/max(p.Elapsed.Seconds(), 0.001), human.Age(p.ETA()))
	}
	res, err := r.Run(ctx, pub, cfg)
	if errors.Is(err, replay.ErrNoHistory) || errors.Is(err, replay.ErrRunning) || errors.Is(err, replay.ErrOtherSelection) {
		return usageErr("%v", err)
	}
	if err != nil {
		return fmt.Errorf("%w (sent %d; run the same command again to continue after seq %d)", err, res.Sent, res.LastSeq)
	}
	how := "sent"
	if res.Resumed {
		how = "continued; sent"
	}
	fmt.Fprintf(stdout, "replay %s: %s %d events (%s) from %s, each marked %s: %s\n", *name, how, res.Sent, f.String(), table, replay.HeaderReplay, *name)
	return nil
}
