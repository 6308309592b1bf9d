// Package replay sends already-published events again, in order, to rebuild a
// consumer or feed a new one: the history a PostgreSQL outbox keeps in mark
// completion (published rows, until cleanup) and in archive completion
// (<table>_published, until retention).
//
// A replay reads the history by write position (seq), so each aggregate's events go
// out in their original order, with their original ids, in the relay's wire format
// (or a router's), marked with the outbox-replay header. It is named: its checkpoint
// (<table>_replays, migration 009) lets an interrupted replay continue where it
// stopped, and only one replay of a name runs at a time. It never touches the
// outbox's unpublished rows or the relay's locks, so live delivery goes on beside it.
//
//	r := replay.New(pool, outboxdriver.Table{})
//	res, err := r.Run(ctx, publisher, &replay.Config{Name: "rebuild-billing",
//		Filter: replay.Filter{AggregateType: "order", Since: time.Now().Add(-24 * time.Hour)}})
package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
)

// HeaderReplay marks a replayed message; its value is the replay's name. Inboxes and
// consumers tell a replay from a first delivery by it (inbox.Config.Reprocess).
const HeaderReplay = wire.HeaderReplay

// Errors callers branch on.
var (
	// ErrNoHistory: the table keeps no published event at all, as in delete
	// completion and the table-less CDC mode.
	ErrNoHistory = errors.New("replay: no published events are kept (delete completion and table-less CDC keep no history; mark and archive completion do)")
	// ErrRunning: another replay of the same name holds its lock.
	ErrRunning = errors.New("replay: a replay of this name is running")
	// ErrOtherSelection: the named replay was started with another selection.
	ErrOtherSelection = errors.New("replay: this name's unfinished replay was started with another selection")
)

// BatchDefault is how many events a replay reads and publishes at once.
const BatchDefault = 1000

// Filter selects published events. Zero fields match every event.
type Filter struct {
	// Since and Until bound the publication time (the creation time with
	// ByCreation): Since inclusive, Until exclusive.
	Since, Until time.Time
	ByCreation   bool
	// AggregateType, AggregateID and Type match exactly.
	AggregateType, AggregateID, Type string
}

// String is the selection as the checkpoint records it.
func (f *Filter) String() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	col := "published"
	if f.ByCreation {
		col = "created"
	}
	if !f.Since.IsZero() {
		add(col+"-since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		add(col+"-until", f.Until.UTC().Format(time.RFC3339Nano))
	}
	add("aggregatetype", f.AggregateType)
	add("aggregateid", f.AggregateID)
	add("type", f.Type)
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " ")
}

// ParseWhen reads a time bound as the command and the dashboard take it: RFC 3339,
// or a duration before now ("24h"); "" is no bound.
func ParseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q: want RFC 3339 (2026-11-30T00:00:00Z) or a duration ago (24h)", s)
	}
	return now.Add(-d), nil
}

// Config configures a replay.
type Config struct {
	// Name names the replay: its checkpoint and its lock. Default "default".
	Name string
	// Filter selects the events.
	Filter Filter
	// Topic is the destination topic template (default
	// broker.TopicTemplateDefault): another one feeds one consumer without
	// disturbing the others. Unused with Router.
	Topic *broker.Template
	// Router, if set, renders the messages (the relay's --format or Debezium
	// router); nil is outbox's own wire format.
	Router relay.Router
	// Rate bounds the events sent per second (0: no bound).
	Rate float64
	// Batch is how many events are read and published at once. Default BatchDefault.
	Batch int
	// Restart starts the named replay over instead of continuing it.
	Restart bool
	// Progress, if set, is called after each batch.
	Progress func(Progress)
	// Logger receives the replay's logs. Default slog.Default().
	Logger *slog.Logger
}

// Progress is how far a replay got.
type Progress struct {
	Sent, Total int64
	Elapsed     time.Duration
}

// ETA estimates the time left from the rate so far (0 when unknown).
func (p Progress) ETA() time.Duration {
	if p.Sent == 0 || p.Total <= p.Sent {
		return 0
	}
	return time.Duration(float64(p.Elapsed) / float64(p.Sent) * float64(p.Total-p.Sent))
}

// Result is what a replay did.
type Result struct {
	Sent    int64
	Resumed bool // it continued an interrupted replay of the same name
	LastSeq int64
	// UntilSeq bounds the replay: the history as it was when the replay started
	// (events published since are live traffic, not history to replay).
	UntilSeq int64
}

// History is what a table keeps of its published events.
type History struct {
	Events int64     // published events kept (marked rows and the archive)
	Oldest time.Time // the oldest one's publication time (zero: none)
}

// Replayer replays one table's history.
type Replayer struct {
	pool                        *pgxpool.Pool
	table                       outboxdriver.Table
	qTable, qPublished, qReplay string
}

// New returns a Replayer of table (its defaults filled) on pool.
func New(pool *pgxpool.Pool, table outboxdriver.Table) *Replayer {
	t := table.WithDefaults()
	return &Replayer{pool: pool, table: t,
		qTable:     pgx.Identifier{t.Schema, t.Name}.Sanitize(),
		qPublished: pgx.Identifier{t.Schema, t.Derived("_published")}.Sanitize(),
		qReplay:    pgx.Identifier{t.Schema, t.Derived("_replays")}.Sanitize(),
	}
}

// History reports how much history the table keeps and how far back it reaches.
func (r *Replayer) History(ctx context.Context) (History, error) {
	var h History
	var oldest *time.Time
	err := r.pool.QueryRow(ctx, `SELECT sum(n)::bigint, min(o) FROM (
  SELECT count(*) AS n, min(published_at) AS o FROM `+r.qTable+` WHERE published_at IS NOT NULL
  UNION ALL SELECT count(*), min(published_at) FROM `+r.qPublished+`) h`).Scan(&h.Events, &oldest)
	if err != nil {
		return h, fmt.Errorf("replay: history of %s: %w", r.table, outboxpgx.InterpretError(err))
	}
	if oldest != nil {
		h.Oldest = *oldest
	}
	return h, nil
}

// where is the selection's SQL condition over the history, from $3 on ($1 is the
// checkpoint's seq, $2 the replay's bound).
func where(f *Filter) (string, []any) {
	col := "published_at"
	if f.ByCreation {
		col = "created_at"
	}
	conds := []string{"seq > $1", "seq <= $2"}
	args := []any{}
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, fmt.Sprintf(cond, len(args)+2))
	}
	if !f.Since.IsZero() {
		add(col+" >= $%d", f.Since)
	}
	if !f.Until.IsZero() {
		add(col+" < $%d", f.Until)
	}
	if f.AggregateType != "" {
		add("aggregatetype = $%d", f.AggregateType)
	}
	if f.AggregateID != "" {
		add("aggregateid = $%d", f.AggregateID)
	}
	if f.Type != "" {
		add("type = $%d", f.Type)
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// history is the union of the kept published events, with cols.
func (r *Replayer) history(cols string) string {
	return `(SELECT ` + cols + ` FROM ` + r.qTable + ` WHERE published_at IS NOT NULL
  UNION ALL SELECT ` + cols + ` FROM ` + r.qPublished + `) h`
}

// DryRun counts what a replay of f would send, per topic (rendered with tmpl, or
// the default template).
func (r *Replayer) DryRun(ctx context.Context, f *Filter, tmpl *broker.Template) (map[string]int64, error) {
	if tmpl == nil {
		tmpl = defaultTemplate()
	}
	w, args := where(f)
	rows, err := r.pool.Query(ctx, `SELECT aggregatetype, type, count(*) FROM `+r.history("seq, aggregatetype, aggregateid, type, published_at, created_at")+w+
		` GROUP BY aggregatetype, type`, append([]any{int64(0), int64(math.MaxInt64)}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", outboxpgx.InterpretError(err))
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var at, typ string
		var n int64
		if err := rows.Scan(&at, &typ, &n); err != nil {
			return nil, err
		}
		out[tmpl.Execute(broker.TopicFields{AggregateType: at, Type: typ}, nil)] += n
	}
	return out, rows.Err()
}

func defaultTemplate() *broker.Template {
	t, _ := broker.ParseTemplate(broker.TopicTemplateDefault)
	return t
}

// Run replays the selected events to pub, from the named replay's checkpoint on.
// It returns when every selected event was acknowledged, or at the first refusal
// (the checkpoint then stands before it: run again to continue).
func (r *Replayer) Run(ctx context.Context, pub broker.Publisher, cfg *Config) (Result, error) {
	c := *cfg
	if c.Name == "" {
		c.Name = "default"
	}
	if c.Batch <= 0 {
		c.Batch = BatchDefault
	}
	if c.Topic == nil {
		c.Topic = defaultTemplate()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Rate < 0 {
		return Result{}, fmt.Errorf("replay: rate %v: want events per second, or 0 for no bound", c.Rate)
	}
	if cr, ok := c.Router.(relay.ColumnRouter); ok && len(cr.Columns()) > 0 {
		// The history keeps the outbox's own columns only (the archive leaves the
		// others behind): a router that reads more cannot render it.
		return Result{}, fmt.Errorf("replay: the router reads columns %v, which the history does not keep: %w", cr.Columns(), outboxdriver.ErrNotSupported)
	}
	h, err := r.History(ctx)
	if err != nil {
		return Result{}, err
	}
	if h.Events == 0 {
		return Result{}, fmt.Errorf("%w: %s", ErrNoHistory, r.table)
	}
	// One replay of a name at a time: a session lock on a connection of its own.
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("replay: %w", outboxpgx.InterpretError(err))
	}
	defer conn.Release()
	lockKey := "outbox-replay:" + r.table.String() + ":" + c.Name
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, lockKey).Scan(&locked); err != nil {
		return Result{}, fmt.Errorf("replay: %w", outboxpgx.InterpretError(err))
	}
	if !locked {
		return Result{}, fmt.Errorf("%w: %q on %s", ErrRunning, c.Name, r.table)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, lockKey)
	}()

	res, err := r.checkpoint(ctx, &c)
	if err != nil {
		return res, err
	}
	w, args := where(&c.Filter)
	var total int64
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.history("seq, aggregatetype, aggregateid, type, published_at, created_at")+w,
		append([]any{res.LastSeq, res.UntilSeq}, args...)...).Scan(&total); err != nil {
		return res, fmt.Errorf("replay: %w", outboxpgx.InterpretError(err))
	}
	// The payload column's type, from the catalog (a table born as a Debezium outbox
	// may hold text): bytes as they are, anything else as its text.
	var payloadType string
	if err := r.pool.QueryRow(ctx, `SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'payload'`,
		r.qTable).Scan(&payloadType); err != nil {
		return res, fmt.Errorf("replay: %w", outboxpgx.InterpretError(err))
	}
	payload := "payload"
	if payloadType != "bytea" {
		payload = "convert_to(payload::text, 'UTF8')"
	}
	var limiter *rate.Limiter
	if c.Rate > 0 {
		// A batch is at most a second's worth: read no more than the limiter lets go.
		c.Batch = max(1, min(c.Batch, int(c.Rate)))
		limiter = rate.NewLimiter(rate.Limit(c.Rate), c.Batch)
	}
	query := `SELECT seq, id::text, aggregatetype, aggregateid, type, payload, payload IS NULL, headers::text, tracingspancontext, created_at FROM ` +
		r.history("seq, id, aggregatetype, aggregateid, type, "+payload+" AS payload, headers, tracingspancontext, created_at, published_at") + w +
		fmt.Sprintf(` ORDER BY seq LIMIT %d`, c.Batch)
	var esc func(string) string
	if e, ok := pub.(broker.TopicEscaper); ok {
		esc = e.EscapeTopicToken
	}
	start := time.Now()
	var sent int64
	for {
		batch, err := r.read(ctx, query, append([]any{res.LastSeq, res.UntilSeq}, args...))
		if err != nil {
			return res, err
		}
		if len(batch) == 0 {
			break
		}
		if limiter != nil {
			if err := limiter.WaitN(ctx, len(batch)); err != nil {
				return res, err
			}
		}
		msgs := make([]broker.Message, len(batch))
		for i := range batch {
			if msgs[i], err = r.message(&batch[i], &c, esc); err != nil {
				return res, fmt.Errorf("replay: event %s: %w", batch[i].ID, err)
			}
		}
		results := pub.Publish(ctx, msgs)
		done := len(batch)
		var failed error
		for i, rr := range results {
			if rr.Err != nil {
				done, failed = i, fmt.Errorf("replay: event %s (seq %d): %w", batch[i].ID, batch[i].Seq, rr.Err)
				break
			}
		}
		if done > 0 {
			res.LastSeq = batch[done-1].Seq
			res.Sent += int64(done)
			sent += int64(done)
			if _, err := r.pool.Exec(ctx, `UPDATE `+r.qReplay+` SET last_seq = $2, sent = sent + $3, updated_at = now() WHERE name = $1`,
				c.Name, res.LastSeq, done); err != nil {
				return res, fmt.Errorf("replay: checkpoint: %w", outboxpgx.InterpretError(err))
			}
		}
		if c.Progress != nil {
			c.Progress(Progress{Sent: sent, Total: total, Elapsed: time.Since(start)})
		}
		if failed != nil {
			return res, failed
		}
	}
	if _, err := r.pool.Exec(ctx, `UPDATE `+r.qReplay+` SET finished_at = now(), updated_at = now() WHERE name = $1`, c.Name); err != nil {
		return res, fmt.Errorf("replay: checkpoint: %w", outboxpgx.InterpretError(err))
	}
	c.Logger.Info("replay: done", "name", c.Name, "sent", res.Sent, "resumed", res.Resumed)
	return res, nil
}

// checkpoint starts the named replay, or continues its unfinished one (which must
// have the same selection).
func (r *Replayer) checkpoint(ctx context.Context, c *Config) (Result, error) {
	var res Result
	sel := c.Filter.String()
	var was string
	var last, until int64
	var finished *time.Time
	err := r.pool.QueryRow(ctx, `SELECT selection, last_seq, until_seq, finished_at FROM `+r.qReplay+` WHERE name = $1`, c.Name).Scan(&was, &last, &until, &finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return res, fmt.Errorf("replay: checkpoint: %w", outboxpgx.InterpretError(err))
	case finished == nil && !c.Restart && was != sel:
		return res, fmt.Errorf("%w: %q selected %q, now %q (continue with the same selection, or start over with --restart)", ErrOtherSelection, c.Name, was, sel)
	case finished == nil && !c.Restart:
		res.LastSeq, res.UntilSeq, res.Resumed = last, until, true
		c.Logger.Info("replay: continuing where it stopped", "name", c.Name, "after_seq", last)
		return res, nil
	}
	err = r.pool.QueryRow(ctx, `WITH h AS (SELECT coalesce(max(seq), 0) AS until FROM `+r.history("seq")+`)
INSERT INTO `+r.qReplay+` (name, selection, until_seq) SELECT $1, $2, h.until FROM h
ON CONFLICT (name) DO UPDATE SET selection = $2, last_seq = 0, until_seq = excluded.until_seq, sent = 0, started_at = now(), updated_at = now(), finished_at = NULL
RETURNING until_seq`, c.Name, sel).Scan(&res.UntilSeq)
	if err != nil {
		return res, fmt.Errorf("replay: checkpoint: %w", outboxpgx.InterpretError(err))
	}
	return res, nil
}

func (r *Replayer) read(ctx context.Context, query string, args []any) ([]outboxdriver.Row, error) {
	rows, err := r.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", outboxpgx.InterpretError(err))
	}
	defer rows.Close()
	var out []outboxdriver.Row
	for rows.Next() {
		var row outboxdriver.Row
		var headers, trace *string
		if err := rows.Scan(&row.Seq, &row.ID, &row.AggregateType, &row.AggregateID, &row.Type, &row.Payload, &row.PayloadNull,
			&headers, &trace, &row.CreatedAt); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		if headers != nil {
			if err := json.Unmarshal([]byte(*headers), &row.Headers); err != nil {
				return nil, fmt.Errorf("replay: event %s: headers: %w", row.ID, err)
			}
		}
		if trace != nil {
			row.TraceContext = *trace
		}
		out = append(out, row)
	}
	return out, outboxpgx.InterpretError(rows.Err())
}

// message renders a row as the relay does, marked as a replay.
func (r *Replayer) message(row *outboxdriver.Row, c *Config, esc func(string) string) (broker.Message, error) {
	h := make(map[string]string, len(row.Headers)+1)
	for k, v := range row.Headers {
		if wire.RowHeaderAllowed(k) { // as the relay: no row header passes for its own
			h[k] = v
		}
	}
	h[HeaderReplay] = c.Name
	row.Headers = h
	var m broker.Message
	if c.Router != nil {
		var err error
		if m, err = c.Router.Route(row, esc); err != nil {
			return m, err
		}
		if _, ok := m.Headers[HeaderReplay]; m.Verbatim && !ok {
			m.Headers[HeaderReplay] = c.Name
			m.HeaderOrder = append(m.HeaderOrder, HeaderReplay)
		}
	} else {
		m = relay.Message(row, c.Topic, esc)
	}
	// Brokers that drop repeats (JetStream's window, SQS FIFO's five minutes) would
	// drop a replay of a recent event as a repeat of its first delivery: the replay's
	// dedup id is its own, the same on every run of the name.
	m.DedupID = "replay:" + c.Name + ":" + m.ID
	return m, nil
}
