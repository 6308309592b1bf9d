package main

import (
	"context"
	"errors"
	"flag"
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
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/replay"
)

// runReplay sends already-published events again (docs/replay.md).
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &replayOptions{}
	fs := newFlags("replay", stderr)
	o.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	table, tmpl, err := o.validate(time.Now())
	if err != nil {
		return err
	}
	if err := o.bo.check(fs); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *o.dsn)
	if err != nil {
		return usageErr("--db: %v", err)
	}
	defer pool.Close()
	r := replay.New(pool, table)
	if o.dryRun {
		return o.dry(ctx, r, table, tmpl, stdout)
	}
	return o.send(ctx, r, table, tmpl, stdout, stderr)
}

// replayOptions are replay's flags.
type replayOptions struct {
	dsn, table                      *string
	broker                          string
	bo                              *brokerOptions
	topic, format, ceMode, ceSource string
	name, since, until              string
	byCreation, dryRun, restart     bool
	filter                          replay.Filter
	rate                            float64
	batch                           int
	scheme                          string // the broker's, once validated ("" for a dry run without one)
}

func (o *replayOptions) register(fs *flag.FlagSet) {
	o.dsn, o.table = dbTableFlags(fs, "database URL: postgres://user@host:5432/db (replay reads PostgreSQL's history)")
	fs.StringVar(&o.broker, "broker", "", "the broker to send to, as the relay's --broker")
	o.bo = brokerFlags(fs)
	fs.StringVar(&o.topic, "topic-template", "", "the destination (default: the relay's default for the broker); another one feeds one consumer without disturbing the others")
	fs.StringVar(&o.format, "format", "outbox", "wire format: outbox or cloudevents, as the relay's --format")
	fs.StringVar(&o.ceMode, "cloudevents-mode", string(cloudevents.Binary), "with --format cloudevents: binary or structured")
	fs.StringVar(&o.ceSource, "cloudevents-source", "", "with --format cloudevents: the source attribute (default /outbox/<schema>.<table>)")
	fs.StringVar(&o.name, "name", "default", "the replay's name: its checkpoint (an interrupted replay of a name continues where it stopped) and its lock (one at a time)")
	fs.StringVar(&o.since, "since", "", "only events published at or after this: RFC 3339 (2026-11-30T00:00:00Z) or a duration ago (24h)")
	fs.StringVar(&o.until, "until", "", "only events published before this: RFC 3339 or a duration ago")
	fs.BoolVar(&o.byCreation, "by-creation-time", false, "--since and --until bound the write time instead of the publication time")
	fs.StringVar(&o.filter.AggregateType, "aggregate-type", "", "only events of this aggregate type")
	fs.StringVar(&o.filter.AggregateID, "aggregate-id", "", "only events of this aggregate id")
	fs.StringVar(&o.filter.Type, "type", "", "only events of this event type")
	fs.Float64Var(&o.rate, "rate", 0, "most events sent per second (0: no bound)")
	fs.IntVar(&o.batch, "batch", replay.BatchDefault, "events read and published at once")
	fs.BoolVar(&o.dryRun, "dry-run", false, "count what would be sent, per topic, and send nothing")
	fs.BoolVar(&o.restart, "restart", false, "start the named replay over instead of continuing it")
}

// validate checks the flags (times relative to now) and returns the table and the
// destination's template.
func (o *replayOptions) validate(now time.Time) (outboxdriver.Table, *broker.Template, error) {
	f := &o.filter
	var err error
	if f.Since, err = replay.ParseWhen(o.since, now); err != nil {
		return outboxdriver.Table{}, nil, usageErr("--since: %v", err)
	}
	if f.Until, err = replay.ParseWhen(o.until, now); err != nil {
		return outboxdriver.Table{}, nil, usageErr("--until: %v", err)
	}
	f.ByCreation = o.byCreation
	switch {
	case *o.dsn == "":
		return outboxdriver.Table{}, nil, usageErr("--db is required")
	case !strings.HasPrefix(*o.dsn, "postgres://") && !strings.HasPrefix(*o.dsn, "postgresql://"):
		return outboxdriver.Table{}, nil, usageErr("--db: replay reads the history PostgreSQL keeps (mark and archive completion); want postgres://")
	case o.rate < 0 || o.batch <= 0:
		return outboxdriver.Table{}, nil, usageErr("--rate must not be negative and --batch must be positive")
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since):
		return outboxdriver.Table{}, nil, usageErr("--until must be after --since")
	case o.format != "outbox" && o.format != "cloudevents":
		return outboxdriver.Table{}, nil, usageErr("--format %q: want outbox or cloudevents", o.format)
	}
	table, err := parseTable(*o.table, "json")
	if err != nil {
		return outboxdriver.Table{}, nil, err
	}
	if o.broker != "" || !o.dryRun { // a dry run needs no broker
		if o.scheme, err = brokerScheme(o.broker, *o.bo); err != nil {
			return outboxdriver.Table{}, nil, err
		}
	}
	if o.topic == "" {
		o.topic = defaultTopicTemplate(o.scheme)
	}
	tmpl, err := broker.ParseTemplate(o.topic)
	if err != nil {
		return outboxdriver.Table{}, nil, usageErr("--topic-template: %v", err)
	}
	return table, tmpl, nil
}

// dry counts what a replay would send, per topic, and sends nothing.
func (o *replayOptions) dry(ctx context.Context, r *replay.Replayer, table outboxdriver.Table, tmpl *broker.Template, stdout io.Writer) error {
	counts, err := r.DryRun(ctx, &o.filter, tmpl)
	if err != nil {
		return err
	}
	var n int64
	for _, t := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(stdout, "%s\t%d\n", termSafe(t), counts[t])
		n += counts[t]
	}
	fmt.Fprintf(stdout, "would send %d events (%s) from %s; nothing sent\n", n, o.filter.String(), table)
	return nil
}

// send replays to the broker, telling its progress on stderr about once a second.
func (o *replayOptions) send(ctx context.Context, r *replay.Replayer, table outboxdriver.Table, tmpl *broker.Template, stdout, stderr io.Writer) error {
	logger, err := newLogger(stderr, "info", "text")
	if err != nil {
		return err
	}
	cfg := &replay.Config{Name: o.name, Filter: o.filter, Topic: tmpl, Rate: o.rate, Batch: o.batch, Restart: o.restart, Logger: logger}
	if cfg.Router, err = newWireFormat(o.format, o.ceMode, o.ceSource, o.scheme, tmpl, nil).router(table, nil); err != nil {
		return usageErr("%v", err)
	}
	o.bo.logger = cfg.Logger
	pub, err := openBroker(ctx, o.broker, *o.bo)
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
		fmt.Fprintf(stderr, "replay %s: %d of %d sent (%.0f/s), about %s left\n", o.name, p.Sent, p.Total,
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
	fmt.Fprintf(stdout, "replay %s: %s %d events (%s) from %s, each marked %s: %s\n", o.name, how, res.Sent, o.filter.String(), table, replay.HeaderReplay, o.name)
	return nil
}
