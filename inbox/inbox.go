// Package inbox is the consumer's half of the outbox pattern: at-least-once delivery
// plus an idempotent consumer is what "exactly once" means in practice.
//
// Process a message inside the consumer's own transaction: the event id is recorded
// (per consumer name) with an insert that ignores conflicts, in the same transaction
// as the handler's changes. A duplicate commits nothing else and is acknowledged:
//
//	outcome, err := ib.Handle(ctx, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "INSERT INTO invoices ...")
//		return err
//	})
//	if err == nil { ack() } // a handler error rolled everything back: let it be redelivered
//
// With Config.VersionGuard, an event older than the last one applied for its aggregate
// (by the relay's outbox-seq header) is skipped as Stale: per-aggregate order holds even
// if a broker redelivers out of order. An event the relay marks late (outbox-late: a
// delayed event, or a dead letter replayed after its aggregate went on past it) is
// processed once, like any other, but is no version: never Stale, and it does not
// make the aggregate's later events Stale either.
//
// The inbox table must not grow forever: Prune deletes records older than the dedup
// window. A redelivery older than the window is processed again, so keep the window
// longer than anything can be redelivered (the broker's retention and redelivery
// limits); the default is seven days.
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/broker"
)

// Defaults.
const (
	TableDefault     = "outbox_inbox"
	RetentionDefault = 7 * 24 * time.Hour
)

// Outcome says what Handle did with a message.
type Outcome int

// Outcomes.
const (
	Processed Outcome = iota // first delivery: the handler ran and its changes committed
	Duplicate                // seen before: nothing ran, nothing changed
	Stale                    // older than an event already applied for its aggregate: skipped
)

func (o Outcome) String() string {
	return [...]string{"processed", "duplicate", "stale"}[o]
}

// Message is a delivered event, in the relay's wire format.
type Message struct {
	ID            string // the event id: the dedup key
	AggregateType string
	AggregateID   string
	Type          string
	Seq           int64 // write position, from the outbox-seq header; 0 if absent
	Payload       []byte
	Headers       map[string]string // every header, trace context included
}

// Late reports whether the relay marked the message as rightly arriving after later
// events of its aggregate (broker.HeaderLate: a delayed event, or a dead letter
// replayed after its aggregate went on): its Seq is no version, and the version guard
// neither skips it nor moves past it.
func (m *Message) Late() bool { return m.header(broker.HeaderLate) != "" }

// Replayed reports whether the message was sent again by `outbox replay` (the
// outbox-replay header).
func (m *Message) Replayed() bool { return m.header(broker.HeaderReplay) != "" }

// header is a header's value, in any case ("" when absent).
func (m *Message) header(name string) string {
	if v, ok := m.Headers[name]; ok {
		return v
	}
	for k, v := range m.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// FromHeaders fills a Message from wire-format headers (any case); payload as given.
func FromHeaders(h map[string]string, payload []byte) Message {
	get := func(name string) string {
		if v, ok := h[name]; ok {
			return v
		}
		for k, v := range h {
			if strings.EqualFold(k, name) {
				return v
			}
		}
		return ""
	}
	m := Message{ID: get(broker.HeaderID), AggregateType: get(broker.HeaderAggregateType), AggregateID: get(broker.HeaderAggregateID),
		Type: get(broker.HeaderEventType), Payload: payload, Headers: h}
	m.Seq, _ = strconv.ParseInt(get(broker.HeaderSeq), 10, 64)
	return m
}

// ErrNoID is returned for a message without an event id: it cannot be deduplicated.
// It is permanent: a consumer loop does not redeliver it.
var ErrNoID = fmt.Errorf("message has no event id: %w", ErrPermanent)

// Dialect is the SQL flavour of a database/sql connection.
type Dialect string

// Dialects.
const (
	Postgres Dialect = "postgres"
	MySQL    Dialect = "mysql"
	SQLite   Dialect = "sqlite"
)

// Config configures an Inbox. The zero value (or nil) gives the defaults.
type Config struct {
	// Table is the inbox table; TABLE_versions holds the version guard. Default
	// TableDefault. Letters, digits and underscores only.
	Table string
	// VersionGuard skips events older than one already applied for their aggregate.
	VersionGuard bool
	// Reprocess processes a replayed event (outbox replay: the outbox-replay header)
	// even when its id was processed before, and whatever the version guard says:
	// for rebuilding a read model from history. Other events are deduplicated as
	// always.
	Reprocess bool
	// Logger hears of every event the version guard skips (Warn) and every event
	// marked late that it lets through (Info): nothing it decides is silent.
	// Default slog.Default().
	Logger *slog.Logger
	// StartSpan, when set, starts a span for a message (continuing the trace in its
	// headers) and returns the context the handler runs in and a func ending the span
	// with the handler's error. outboxotel.InboxSpan provides it for OpenTelemetry.
	StartSpan func(ctx context.Context, consumer string, msg *Message) (context.Context, func(outcome Outcome, err error))
}

var tableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,50}$`)

// Inbox records processed events. Build it with NewPgx or NewSQL.
type Inbox[TTx any] struct {
	cfg     Config
	dialect Dialect
	stats   struct{ stale, late atomic.Int64 }
	q       queries
	begin   func(ctx context.Context) (TTx, error)
	commit  func(ctx context.Context, tx TTx) error
	abort   func(ctx context.Context, tx TTx) error
	exec    func(ctx context.Context, tx TTx, q string, args ...any) (int64, error)
	execDB  func(ctx context.Context, q string, args ...any) (int64, error)
}

func newInbox[TTx any](d Dialect, cfg *Config) (*Inbox[TTx], error) {
	ib := &Inbox[TTx]{dialect: d}
	if cfg != nil {
		ib.cfg = *cfg
	}
	if ib.cfg.Table == "" {
		ib.cfg.Table = TableDefault
	}
	if ib.cfg.Logger == nil {
		ib.cfg.Logger = slog.Default()
	}
	if !tableRE.MatchString(ib.cfg.Table) {
		return nil, fmt.Errorf("inbox: table name %q must match %s", ib.cfg.Table, tableRE)
	}
	switch d {
	case Postgres, MySQL, SQLite:
	default:
		return nil, fmt.Errorf("inbox: unknown dialect %q", d)
	}
	ib.q = buildQueries(d, ib.cfg.Table)
	return ib, nil
}

// NewPgx returns an inbox on a pgx pool (PostgreSQL).
func NewPgx(pool *pgxpool.Pool, cfg *Config) (*Inbox[pgx.Tx], error) {
	if pool == nil {
		return nil, errors.New("inbox: pool is nil")
	}
	ib, err := newInbox[pgx.Tx](Postgres, cfg)
	if err != nil {
		return nil, err
	}
	ib.begin = func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) }
	ib.commit = func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }
	ib.abort = func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }
	ib.exec = func(ctx context.Context, tx pgx.Tx, q string, args ...any) (int64, error) {
		tag, err := tx.Exec(ctx, q, args...)
		return tag.RowsAffected(), err
	}
	ib.execDB = func(ctx context.Context, q string, args ...any) (int64, error) {
		tag, err := pool.Exec(ctx, q, args...)
		return tag.RowsAffected(), err
	}
	return ib, nil
}

// NewSQL returns an inbox on a database/sql handle of the given dialect (PostgreSQL
// through pgx stdlib, MySQL/MariaDB through go-sql-driver/mysql, SQLite).
func NewSQL(db *sql.DB, d Dialect, cfg *Config) (*Inbox[*sql.Tx], error) {
	if db == nil {
		return nil, errors.New("inbox: db is nil")
	}
	ib, err := newInbox[*sql.Tx](d, cfg)
	if err != nil {
		return nil, err
	}
	ib.begin = func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) }
	ib.commit = func(_ context.Context, tx *sql.Tx) error { return tx.Commit() }
	ib.abort = func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() }
	ib.exec = func(ctx context.Context, tx *sql.Tx, q string, args ...any) (int64, error) {
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	ib.execDB = func(ctx context.Context, q string, args ...any) (int64, error) {
		res, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	return ib, nil
}

// Migrate creates the inbox tables if they do not exist.
func (ib *Inbox[TTx]) Migrate(ctx context.Context) error {
	for _, stmt := range ib.q.schema {
		if _, err := ib.execDB(ctx, stmt); err != nil {
			return fmt.Errorf("inbox: migrate: %w", err)
		}
	}
	return nil
}

// RecordTx records msg for consumer inside tx, the caller's transaction. Processed
// means the caller goes on with its changes in tx; Duplicate and Stale mean it skips
// them (and still commits, so the outcome is kept).
func (ib *Inbox[TTx]) RecordTx(ctx context.Context, tx TTx, consumer string, msg *Message) (Outcome, error) {
	if msg.ID == "" {
		return 0, ErrNoID
	}
	n, err := ib.exec(ctx, tx, ib.q.record, consumer, msg.ID, msg.AggregateType, msg.AggregateID, msg.Seq, time.Now().UTC())
	if err != nil {
		return 0, fmt.Errorf("inbox: record %s: %w", msg.ID, err)
	}
	if ib.cfg.Reprocess && msg.Replayed() {
		return Processed, nil // a rebuild: neither the record nor the guard stands in its way
	}
	if n == 0 {
		return Duplicate, nil
	}
	if !ib.cfg.VersionGuard || msg.Seq <= 0 || msg.AggregateID == "" {
		return Processed, nil
	}
	if msg.Late() {
		ib.stats.late.Add(1)
		ib.cfg.Logger.Info("inbox: event marked late by the relay; processed outside the version guard", "consumer", consumer,
			"id", msg.ID, "aggregatetype", msg.AggregateType, "aggregateid", msg.AggregateID, "seq", msg.Seq, "late", msg.header(broker.HeaderLate))
		return Processed, nil
	}
	n, err = ib.exec(ctx, tx, ib.q.guard, consumer, msg.AggregateType, msg.AggregateID, msg.Seq)
	if err != nil {
		return 0, fmt.Errorf("inbox: version guard %s: %w", msg.ID, err)
	}
	if n == 0 {
		ib.stats.stale.Add(1)
		ib.cfg.Logger.Warn("inbox: event older than one already applied for its aggregate, and not marked late; skipped by the version guard",
			"consumer", consumer, "id", msg.ID, "aggregatetype", msg.AggregateType, "aggregateid", msg.AggregateID, "seq", msg.Seq)
		return Stale, nil
	}
	return Processed, nil
}

// GuardStats count the version guard's decisions since the inbox was built, each
// counted when RecordTx decides it (a transaction rolled back afterwards counts
// again when its message comes again).
type GuardStats struct {
	Stale int64 // older unmarked events skipped
	Late  int64 // events marked late (outbox-late) processed outside the guard
}

// GuardStats returns the version guard's counters.
func (ib *Inbox[TTx]) GuardStats() GuardStats {
	return GuardStats{Stale: ib.stats.stale.Load(), Late: ib.stats.late.Load()}
}

// Handle processes msg once for consumer: in one new transaction it records the event
// and, on first delivery, runs fn. fn's error rolls everything back and is returned
// (do not acknowledge: the message comes again). A duplicate or stale message
// commits only its record and returns nil (acknowledge it).
func (ib *Inbox[TTx]) Handle(ctx context.Context, consumer string, msg *Message, fn func(ctx context.Context, tx TTx) error) (outcome Outcome, err error) {
	if ib.cfg.StartSpan != nil {
		var end func(Outcome, error)
		ctx, end = ib.cfg.StartSpan(ctx, consumer, msg)
		defer func() { end(outcome, err) }()
	}
	tx, err := ib.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: begin: %w", err)
	}
	outcome, err = ib.RecordTx(ctx, tx, consumer, msg)
	if err == nil && outcome == Processed {
		err = fn(ctx, tx)
	}
	if err != nil {
		_ = ib.abort(context.WithoutCancel(ctx), tx)
		return outcome, err
	}
	if err := ib.commit(ctx, tx); err != nil {
		return outcome, fmt.Errorf("inbox: commit: %w", err)
	}
	return outcome, nil
}

// Prune deletes records processed more than olderThan ago (RetentionDefault if 0), in
// batches of batch rows (10,000 if 0) so it never holds long locks. It returns how
// many it deleted. Version-guard rows are kept: they are one per aggregate.
func (ib *Inbox[TTx]) Prune(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	if olderThan <= 0 {
		olderThan = RetentionDefault
	}
	if batch <= 0 {
		batch = 10_000
	}
	cutoff := time.Now().UTC().Add(-olderThan)
	var total int64
	for {
		n, err := ib.execDB(ctx, ib.q.prune, cutoff, batch)
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}

type queries struct {
	schema               []string
	record, guard, prune string
}

func buildQueries(d Dialect, table string) queries {
	t, v := table, table+"_versions"
	switch d {
	case MySQL:
		return queries{
			schema: []string{
				"CREATE TABLE IF NOT EXISTS `" + t + "` (consumer VARCHAR(191) NOT NULL, event_id VARCHAR(64) NOT NULL, " +
					"aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL, seq BIGINT NOT NULL, " +
					"processed_at DATETIME(6) NOT NULL, PRIMARY KEY (consumer, event_id), KEY `" + t + "_processed_idx` (processed_at))",
				"CREATE TABLE IF NOT EXISTS `" + v + "` (consumer VARCHAR(191) NOT NULL, aggregatetype VARCHAR(191) NOT NULL, " +
					"aggregateid VARCHAR(191) NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (consumer, aggregatetype, aggregateid))",
			},
			record: "INSERT IGNORE INTO `" + t + "` (consumer, event_id, aggregatetype, aggregateid, seq, processed_at) VALUES (?, ?, ?, ?, ?, ?)",
			// Without CLIENT_FOUND_ROWS an unchanged row counts 0: stale.
			guard: "INSERT INTO `" + v + "` (consumer, aggregatetype, aggregateid, seq) VALUES (?, ?, ?, ?) " +
				"ON DUPLICATE KEY UPDATE seq = IF(seq < VALUES(seq), VALUES(seq), seq)",
			prune: "DELETE FROM `" + t + "` WHERE processed_at < ? LIMIT ?",
		}
	case SQLite:
		return queries{
			schema: []string{
				`CREATE TABLE IF NOT EXISTS "` + t + `" (consumer TEXT NOT NULL, event_id TEXT NOT NULL, aggregatetype TEXT NOT NULL,
  aggregateid TEXT NOT NULL, seq INTEGER NOT NULL, processed_at TIMESTAMP NOT NULL, PRIMARY KEY (consumer, event_id))`,
				`CREATE INDEX IF NOT EXISTS "` + t + `_processed_idx" ON "` + t + `" (processed_at)`,
				`CREATE TABLE IF NOT EXISTS "` + v + `" (consumer TEXT NOT NULL, aggregatetype TEXT NOT NULL, aggregateid TEXT NOT NULL,
  seq INTEGER NOT NULL, PRIMARY KEY (consumer, aggregatetype, aggregateid))`,
			},
			record: `INSERT INTO "` + t + `" (consumer, event_id, aggregatetype, aggregateid, seq, processed_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
			guard: `INSERT INTO "` + v + `" (consumer, aggregatetype, aggregateid, seq) VALUES (?, ?, ?, ?)
  ON CONFLICT (consumer, aggregatetype, aggregateid) DO UPDATE SET seq = excluded.seq WHERE seq < excluded.seq`,
			prune: `DELETE FROM "` + t + `" WHERE rowid IN (SELECT rowid FROM "` + t + `" WHERE processed_at < ? LIMIT ?)`,
		}
	}
	return queries{
		schema: []string{
			`CREATE TABLE IF NOT EXISTS "` + t + `" (consumer text NOT NULL, event_id text NOT NULL, aggregatetype text NOT NULL,
  aggregateid text NOT NULL, seq bigint NOT NULL, processed_at timestamptz NOT NULL, PRIMARY KEY (consumer, event_id))`,
			`CREATE INDEX IF NOT EXISTS "` + t + `_processed_idx" ON "` + t + `" (processed_at)`,
			`CREATE TABLE IF NOT EXISTS "` + v + `" (consumer text NOT NULL, aggregatetype text NOT NULL, aggregateid text NOT NULL,
  seq bigint NOT NULL, PRIMARY KEY (consumer, aggregatetype, aggregateid))`,
		},
		record: `INSERT INTO "` + t + `" (consumer, event_id, aggregatetype, aggregateid, seq, processed_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
		guard: `INSERT INTO "` + v + `" AS v (consumer, aggregatetype, aggregateid, seq) VALUES ($1, $2, $3, $4)
  ON CONFLICT (consumer, aggregatetype, aggregateid) DO UPDATE SET seq = excluded.seq WHERE v.seq < excluded.seq`,
		prune: `DELETE FROM "` + t + `" WHERE ctid IN (SELECT ctid FROM "` + t + `" WHERE processed_at < $1 LIMIT $2)`,
	}
}
