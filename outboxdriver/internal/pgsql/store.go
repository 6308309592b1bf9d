package pgsql

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/pgmessage"
)

var errNoRows = errors.New("no rows")

// Statements is the SQL for one outbox table, built once from validated, quoted names.
type Statements struct {
	table      outboxdriver.Table
	qualified  string // "schema"."name"
	channel    string // LISTEN/NOTIFY channel, quoted
	channelRaw string
	lockKey    int64
	claimFence int64

	insertValues []string // insertValues[n] inserts n rows with VALUES, for small n
	insertPlain  []string // the same for rows of the five Debezium columns only
	extras       extraClaims
	dead         string // quoted dead-letter table
	cdc          string // quoted CDC slot bookkeeping table
	relays       string // quoted relay registry (several active relays)
	leases       string // quoted partition leases
	published    string // quoted archive of published rows (completion "archive")

	insert, candidates, claim, markPublished, deletePublished, archivePublished, recordFailure, moveDead, status string
	// The same write-backs, applied only while the relay holds the partitions' leases
	// at the epochs it claimed under (several active relays).
	fencedMark, fencedDelete, fencedArchive, fencedFailure, fencedDead string
}

// NewStatements validates t and builds its statements.
func NewStatements(t outboxdriver.Table) (*Statements, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	q := pgx.Identifier{t.Schema, t.Name}.Sanitize()
	s := &Statements{table: t, qualified: q}
	// A channel name is an identifier: at most 63 bytes, or NOTIFY fails (and with it
	// the writer's transaction) while LISTEN silently truncates.
	s.channelRaw = ChannelOf(t)
	s.channel = pgx.Identifier{s.channelRaw}.Sanitize()
	h := fnv.New64a()
	h.Write([]byte("outbox relay leadership " + t.String()))
	s.lockKey = int64(h.Sum64())
	// lockKey+1 serialises migrations; lockKey+2 fences claims (see claimFence).
	s.claimFence = s.lockKey + 2

	payloadArg, payloadExpr := "$5::text[]", "u.p::jsonb"
	if t.Payload == outboxdriver.PayloadBytes {
		payloadArg, payloadExpr = "$5::bytea[]", "u.p"
	}
	// Small writes (the common case: a few events per business transaction) use a
	// multi-row VALUES statement, prepared once per row count; it is what a hand-written
	// INSERT costs. Larger ones unnest arrays server-side, so one statement text (and
	// one prepared plan) serves any number of rows.
	s.dead = pgx.Identifier{t.Schema, t.Derived("_dead")}.Sanitize()
	s.cdc = pgx.Identifier{t.Schema, t.Derived("_cdc")}.Sanitize()
	s.relays = pgx.Identifier{t.Schema, t.Derived("_relays")}.Sanitize()
	s.leases = pgx.Identifier{t.Schema, t.Derived("_leases")}.Sanitize()
	s.published = pgx.Identifier{t.Schema, t.Derived("_published")}.Sanitize()
	s.insertValues = make([]string, maxValuesRows+1)
	s.insertPlain = make([]string, maxValuesRows+1)
	for n := 1; n <= maxValuesRows; n++ {
		var b, plain strings.Builder
		b.WriteString(`INSERT INTO ` + q + ` (id, aggregatetype, aggregateid, type, payload, headers, available_at, tracingspancontext) VALUES `)
		plain.WriteString(`INSERT INTO ` + q + ` (id, aggregatetype, aggregateid, type, payload) VALUES `)
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
				plain.WriteByte(',')
			}
			p := i * insertCols
			fmt.Fprintf(&b, "($%d,$%d,$%d,$%d,$%d,$%d,coalesce($%d::timestamptz, now()),$%d)", p+1, p+2, p+3, p+4, p+5, p+6, p+7, p+8)
			p = i * plainCols
			fmt.Fprintf(&plain, "($%d,$%d,$%d,$%d,$%d)", p+1, p+2, p+3, p+4, p+5)
		}
		s.insertValues[n] = b.String()
		s.insertPlain[n] = plain.String()
	}
	s.insert = `INSERT INTO ` + q + ` (id, aggregatetype, aggregateid, type, payload, headers, available_at, tracingspancontext)
SELECT u.id::uuid, u.at, u.aid, u.t, ` + payloadExpr + `, u.h::jsonb, coalesce(u.av, now()), u.tc
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], ` + payloadArg + `, $6::text[], $7::timestamptz[], $8::text[]) AS u(id, at, aid, t, p, h, av, tc)`
	// A claim is two reads (outboxdriver.ClaimHeads, the head rule). The candidates:
	// rows due, no earlier row of their aggregate failing (waiting for a retry), no
	// dead letter holding their aggregate (a failing event blocks only its own
	// aggregate, in order), in seq order, read without locking; then the lock of
	// those no other session holds.
	s.candidates = `SELECT o.seq, o.aggregatetype, o.aggregateid, coalesce(pg_column_size(o.payload), 0)
FROM ` + q + ` AS o
WHERE o.published_at IS NULL AND o.available_at <= now() AND ($2 <= 0 OR o.seq <= $2) AND o.seq > $4
  AND ($3::smallint[] IS NULL OR o.partition = ANY($3::smallint[]))
  AND ($5::bigint[] IS NULL OR NOT (o.seq = ANY($5::bigint[])))
  AND ` + sqlrules.NotBehindFailingSQL(q) + `
  AND ` + sqlrules.NotHeldSQL(s.dead) + `
ORDER BY o.seq LIMIT $1`
	s.claim = `SELECT o.seq, o.id::text, o.aggregatetype, o.aggregateid, o.type, o.payload, o.headers::text, o.tracingspancontext, o.created_at, o.attempts, o.partition
FROM ` + q + ` AS o
WHERE o.seq = ANY($1::bigint[]) AND o.published_at IS NULL
ORDER BY o.seq FOR UPDATE OF o SKIP LOCKED`
	s.markPublished = `UPDATE ` + q + ` AS o SET published_at = now(), last_error = NULL WHERE o.id = ANY($1::text[]::uuid[])`
	s.deletePublished = `DELETE FROM ` + q + ` AS o WHERE o.id = ANY($1::text[]::uuid[])`
	// The outbox's own columns move; a column added to the table after the archive
	// was made stays behind (the archive keeps its defaults).
	const archived = "id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, seq, created_at, attempts"
	archive := func(where string) string {
		return `moved AS (DELETE FROM ` + q + ` AS o WHERE o.id = ANY($1::text[]::uuid[])` + where + ` RETURNING ` + prefixed("o.", archived) + `)
INSERT INTO ` + s.published + ` (` + archived + `, published_at) SELECT ` + prefixed("m.", archived) + `, now() FROM moved AS m`
	}
	s.archivePublished = "WITH " + archive("")
	s.recordFailure = `UPDATE ` + q + ` AS o SET attempts = o.attempts + f.n, last_error = f.err,
       available_at = coalesce(f.retry, o.available_at)
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::timestamptz[]) AS f(id, err, n, retry) WHERE o.id = f.id`
	s.moveDead = `WITH f AS (SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[], $4::bool[]) AS f(id, err, n, hold)),
moved AS (DELETE FROM ` + q + ` AS o USING f WHERE o.id = f.id
          RETURNING o.id, o.aggregatetype, o.aggregateid, o.type, o.payload, o.headers, o.tracingspancontext,
                    o.seq, o.created_at, o.attempts + f.n AS attempts, f.err, f.hold)
INSERT INTO ` + s.dead + ` (` + sqlrules.DeadLetterColumns + `)
SELECT * FROM moved`
	s.status = `SELECT count(*) FILTER (WHERE published_at IS NULL),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE published_at IS NULL)), 0)::float8,
       count(*) FILTER (WHERE published_at IS NOT NULL) + (SELECT count(*) FROM ` + s.published + `),
       count(*) FILTER (WHERE published_at IS NULL AND attempts > 0),
       (SELECT count(*) FROM ` + s.dead + `),
       (SELECT count(DISTINCT (aggregatetype, aggregateid)) FROM ` + s.dead + ` WHERE holds_key),
       least(min(published_at), (SELECT min(published_at) FROM ` + s.published + `))
FROM ` + q
	const held = " AND o.partition IN (SELECT partition FROM held)"
	s.fencedMark = "WITH " + s.heldLeases(2) + " " + s.markPublished + held
	s.fencedDelete = "WITH " + s.heldLeases(2) + " " + s.deletePublished + held
	s.fencedArchive = "WITH " + s.heldLeases(2) + ", " + archive(held)
	s.fencedFailure = "WITH " + s.heldLeases(5) + " " + s.recordFailure + held
	s.fencedDead = strings.Replace(strings.Replace(s.moveDead, "WITH ", "WITH "+s.heldLeases(5)+", ", 1),
		"WHERE o.id = f.id", "WHERE o.id = f.id"+held, 1)
	return s, nil
}

// heldLeases is a CTE, "held", of the partitions still leased to the relay ($n) at
// the epochs it claimed under ($n+1 partitions, $n+2 epochs). It is read once per
// statement, and locks the lease rows (FOR SHARE), so a takeover waits for this
// write-back to commit, or this write-back sees the takeover and applies to nothing.
func (s *Statements) heldLeases(n int) string {
	return fmt.Sprintf(`held AS MATERIALIZED (SELECT l.partition FROM %s AS l
  JOIN unnest($%d::smallint[], $%d::bigint[]) AS h(p, e) ON h.p = l.partition AND h.e = l.epoch
  WHERE l.owner = $%d AND l.lease_until > now() FOR SHARE OF l)`, s.leases, n+1, n+2, n)
}

// Table returns the table.
func (s *Statements) Table() outboxdriver.Table { return s.table }

// Channel is the raw NOTIFY channel name.
func (s *Statements) Channel() string { return s.channelRaw }

// ListenSQL is the LISTEN statement.
func (s *Statements) ListenSQL() string { return "LISTEN " + s.channel }

// ChannelOf is table t's LISTEN/NOTIFY channel, unquoted.
func ChannelOf(t outboxdriver.Table) string {
	return outboxdriver.DerivedName("outbox."+t.String(), "")
}

// InterpretError translates PostgreSQL errors to the outboxdriver sentinels. It is the
// one place that knows SQLSTATE codes.
func InterpretError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01", "3F000": // undefined_table, invalid_schema_name
			return fmt.Errorf("%w: %s", outboxdriver.ErrTableMissing, pgErr.Message)
		case "42703": // undefined_column: a table made by hand, or by an older version
			return fmt.Errorf("%w: %s (run `outbox migrate`)", outboxdriver.ErrSchemaBehind, pgErr.Message)
		case "23505": // unique_violation
			return fmt.Errorf("%w: %s", outboxdriver.ErrDuplicateID, pgErr.Detail)
		}
	}
	return err
}

// maxValuesRows is the most rows inserted with a VALUES statement.
const maxValuesRows = 32

// insertCols is the number of parameters per row of the VALUES insert; plainCols of
// the insert of the five Debezium columns, the rest left to their defaults.
const (
	insertCols = 8
	plainCols  = 5
)

// availableAt is the parameter for an event's available_at: NULL means now().
func availableAt(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Executor runs writer statements on q.
type Executor struct {
	Statements *Statements
	Querier    Querier
}

// InsertEvents implements outboxdriver.Executor.
func (e Executor) InsertEvents(ctx context.Context, p *outboxdriver.InsertParams) error {
	n := len(p.Events)
	if n == 0 {
		return nil
	}
	switch e.Statements.table.Write {
	case outboxdriver.WriteMessage:
		return e.emitMessages(ctx, p.Events)
	case outboxdriver.WriteInsertDelete:
		if err := e.insertRows(ctx, p.Events); err != nil {
			return err
		}
		ids := make([]string, n)
		for i := range p.Events {
			ids[i] = p.Events[i].ID
		}
		// The insert is in the WAL for the CDC relay; the row itself is not needed.
		return InterpretError(e.Querier.Exec(ctx, e.Statements.deletePublished, ids))
	}
	return e.insertRows(ctx, p.Events)
}

// emitMessages writes each event as a transactional logical decoding message, in
// order, with one statement: the table-less mode.
func (e Executor) emitMessages(ctx context.Context, events []outboxdriver.InsertEvent) error {
	contents := make([][]byte, len(events))
	for i := range events {
		c, err := pgmessage.Encode(&events[i])
		if err != nil {
			return err
		}
		contents[i] = c
	}
	// Each event's order number comes from the table's own sequence, as a row's does,
	// spliced in as the header's first key ({"seq":N,...): outbox-seq then increases
	// in write order across the write modes, and across a switch between them.
	return InterpretError(e.Querier.Exec(ctx, `WITH s AS (SELECT pg_get_serial_sequence($3, 'seq') AS name)
SELECT count(pg_logical_emit_message(true, $1, convert_to('{"seq":' || nextval(s.name) || ',', 'UTF8') || substring(u.c FROM 2)))
FROM s, unnest($2::bytea[]) WITH ORDINALITY AS u(c, i)`,
		e.Statements.table.MessagePrefix, contents, e.Statements.qualified))
}

func (e Executor) insertRows(ctx context.Context, events []outboxdriver.InsertEvent) error {
	n := len(events)
	p := &outboxdriver.InsertParams{Events: events}
	if n <= maxValuesRows {
		// Events with no headers, delay or trace context (the common case) take the
		// five-column statement: three NULL parameters and a coalesce per row cost
		// producers ~10% at 10 events per transaction (docs/benchmarks.md).
		plain := true
		for i := range events {
			ev := &events[i]
			plain = plain && ev.Headers == nil && ev.AvailableAt.IsZero() && ev.TraceContext == ""
		}
		cols, stmt := insertCols, e.Statements.insertValues[n]
		if plain {
			cols, stmt = plainCols, e.Statements.insertPlain[n]
		}
		args := make([]any, 0, n*cols)
		bytesPayload := e.Statements.table.Payload == outboxdriver.PayloadBytes
		for _, ev := range p.Events {
			var payload any = string(ev.Payload)
			if bytesPayload {
				payload = nonNil(ev.Payload)
			}
			if plain {
				args = append(args, ev.ID, ev.AggregateType, ev.AggregateID, ev.Type, payload)
				continue
			}
			var headers any
			if ev.Headers != nil {
				headers = string(ev.Headers)
			}
			args = append(args, ev.ID, ev.AggregateType, ev.AggregateID, ev.Type, payload, headers, availableAt(ev.AvailableAt), nullable(ev.TraceContext))
		}
		return InterpretError(e.Querier.Exec(ctx, stmt, args...))
	}
	ids, ats, aids, types := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	headers := make([]*string, n)
	avail := make([]*time.Time, n)
	traces := make([]*string, n)
	var payload any
	if e.Statements.table.Payload == outboxdriver.PayloadBytes {
		ps := make([][]byte, n)
		for i := range p.Events {
			ps[i] = nonNil(p.Events[i].Payload)
		}
		payload = ps
	} else {
		ps := make([]string, n)
		for i := range p.Events {
			ps[i] = string(p.Events[i].Payload)
		}
		payload = ps
	}
	for i, ev := range p.Events {
		ids[i], ats[i], aids[i], types[i] = ev.ID, ev.AggregateType, ev.AggregateID, ev.Type
		if ev.Headers != nil {
			h := string(ev.Headers)
			headers[i] = &h
		}
		avail[i] = availableAt(ev.AvailableAt)
		traces[i] = nullable(ev.TraceContext)
	}
	return InterpretError(e.Querier.Exec(ctx, e.Statements.insert, ids, ats, aids, types, payload, headers, avail, traces))
}

// nullable is NULL for an empty string.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nonNil keeps an empty payload empty rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Notify implements outboxdriver.Executor. Only rows are polled: the other write
// modes are read from the WAL, with no need for a wake-up.
func (e Executor) Notify(ctx context.Context) error {
	if e.Statements.table.Write != outboxdriver.WriteRows {
		return nil
	}
	return InterpretError(e.Querier.Exec(ctx, "SELECT pg_notify($1, '')", e.Statements.channelRaw))
}

// Store implements outboxdriver.Store on a DB.
type Store struct {
	Statements *Statements
	DB         DB
	floor      floor // where claims may start reading (floor.go)
	// Sessions, when set, is where the leadership lock is taken: a direct
	// connection to PostgreSQL when DB goes through a transaction-pooling proxy
	// (PgBouncer), where a session-level lock would stay behind on a pooled server
	// connection. nil: DB.
	Sessions DB
	// ListenFunc, when set, opens a listener (only the pgx driver can LISTEN).
	ListenFunc func(ctx context.Context) (outboxdriver.Listener, error)
}

// Capabilities implements outboxdriver.Source: PostgreSQL honours everything but
// LISTEN through database/sql (no ListenFunc).
func (s *Store) Capabilities() outboxdriver.Capabilities {
	return outboxdriver.Capabilities{
		Completions: []outboxdriver.Completion{outboxdriver.CompleteMark, outboxdriver.CompleteDelete, outboxdriver.CompleteArchive},
		Columns:     true,
		MaxSeq:      true,
		Listen:      s.ListenFunc != nil,
		Split:       true,
	}
}

// Claim implements outboxdriver.Store.
func (s *Store) Claim(ctx context.Context, p *outboxdriver.ClaimParams) (outboxdriver.Claim, error) {
	below := s.claimFloor(ctx) - 1 // every row below the floor is published or gone
	tx, err := s.DB.Begin(ctx)
	if err != nil {
		return nil, InterpretError(err)
	}
	var parts []int16
	if p.Group != nil {
		parts = make([]int16, 0, len(p.Group.Leases))
		for _, l := range p.Group.Leases {
			parts = append(parts, int16(l.Partition))
		}
	}
	// A paused or cut-off relay's claim must not hold its rows long past its
	// leadership: the server ends the session (and its locks) when the transaction
	// idles for HoldTimeout. It holds the claim fence, shared, until then: the next
	// leader waits for it (AcquireLeadership) rather than claim past its rows.
	hold := ""
	if p.HoldTimeout > 0 {
		hold = strconv.FormatInt(p.HoldTimeout.Milliseconds(), 10)
	}
	if err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1),
  CASE WHEN $2 <> '' THEN set_config('idle_in_transaction_session_timeout', $2, true) END`, s.Statements.claimFence, hold); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, InterpretError(err)
	}
	if len(p.Columns) > 0 {
		if err := tx.Exec(ctx, "SELECT set_config('DateStyle', 'ISO', true)"); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, InterpretError(err)
		}
	}
	c := &claim{s: s, tx: tx, group: p.Group}
	c.rows, err = outboxdriver.ClaimHeads(ctx, p, outboxdriver.ClaimQueries{
		Candidates: func(ctx context.Context, q *outboxdriver.ClaimParams, after int64, ahead []int64) ([]outboxdriver.Candidate, error) {
			stmt, args := s.Statements.candidates, []any{q.Limit, p.MaxSeq, parts, max(after, below), ahead}
			if len(q.Skip) > 0 {
				stmt, args = skipping(stmt, len(args)+1), append(args, skipArgs(q.Skip)...)
			}
			rows, err := tx.Query(ctx, stmt, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return outboxdriver.ScanCandidates(rows.Next, rows.Scan, rows.Err)
		},
		Lock: func(ctx context.Context, seqs []int64) ([]outboxdriver.Row, error) {
			stmt, args := s.Statements.claimWith(p.Columns), []any{seqs}
			if p.Group != nil {
				// Only partitions still leased to this relay at the epochs it claims
				// under, as the statement sees the leases when it runs. A claim a
				// cut-off member sent before the cut and the server ran after its
				// lease moved (a connection that delivers late) then locks nothing.
				// (Not FOR SHARE: the lease rows must stay free for a takeover while
				// the claim's batch is out; a claim that began before the takeover is
				// what the new owner's barrier waits for.)
				stmt = "WITH " + strings.Replace(s.Statements.heldLeases(len(args)+1), " FOR SHARE OF l)", ")", 1) + "\n" +
					strings.Replace(stmt, "\nORDER BY o.seq", "\n  AND o.partition IN (SELECT partition FROM held)\nORDER BY o.seq", 1)
				args = append(args, (&claim{group: p.Group}).fenceArgs()...)
			}
			rows, err := tx.Query(ctx, stmt, args...)
			if err != nil {
				return nil, err
			}
			return scanRows(rows, len(seqs), p.Columns)
		},
	})
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, InterpretError(err)
	}
	if len(c.rows) > 0 {
		var top int64
		for i := range c.rows {
			top = max(top, c.rows[i].Seq)
		}
		s.claimedUpTo(top)
	}
	if len(c.rows) == 0 {
		// Nothing to hold: end the transaction now.
		err = tx.Rollback(ctx)
		c.tx = nil
		if err != nil {
			return nil, InterpretError(err)
		}
	}
	return c, nil
}

// scanRows reads a claim statement's rows (at most n), each with the extra columns
// cols (ClaimParams.Columns).
func scanRows(rows Rows, n int, cols []string) ([]outboxdriver.Row, error) {
	defer rows.Close()
	// Rows are scanned in place, through one destination list: per row, the
	// relay's hot path allocates only what the row's values need.
	out := make([]outboxdriver.Row, 0, min(max(n, 1), 4096))
	var (
		headers   []byte
		trace     *string
		partition int16
		extra     []*string
	)
	dest := make([]any, 11, 11+2*len(cols))
	dest[6], dest[7], dest[10] = &headers, &trace, &partition
	if len(cols) > 0 {
		extra = make([]*string, 2*len(cols))
		for i := range extra {
			dest = append(dest, &extra[i])
		}
	}
	for rows.Next() {
		out = append(out, outboxdriver.Row{})
		r := &out[len(out)-1]
		dest[0], dest[1], dest[2], dest[3], dest[4], dest[5], dest[8], dest[9] =
			&r.Seq, &r.ID, &r.AggregateType, &r.AggregateID, &r.Type, &r.Payload, &r.CreatedAt, &r.Attempts
		headers, trace = nil, nil
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if len(cols) > 0 {
			r.Columns = make(map[string]outboxdriver.Value, len(cols))
			for i, c := range cols {
				r.Columns[c] = outboxdriver.ParseValue(*extra[2*i], extra[2*i+1])
			}
		}
		r.PayloadNull, r.Partition = r.Payload == nil, int(partition)
		if headers != nil {
			r.Headers = outboxdriver.ParseHeaders(headers)
		}
		if trace != nil {
			r.TraceContext = *trace
		}
	}
	return out, rows.Err()
}

// skipping is a claim statement that also skips the aggregates of ClaimParams.Skip,
// given as two arrays ($n types, $n+1 ids).
func skipping(claim string, n int) string {
	return strings.Replace(claim, "\nORDER BY o.seq", fmt.Sprintf(`
  AND NOT EXISTS (SELECT 1 FROM unnest($%d::text[], $%d::text[]) AS k(t, i) WHERE k.t = o.aggregatetype AND k.i = o.aggregateid)
ORDER BY o.seq`, n, n+1), 1)
}

func skipArgs(skip []outboxdriver.Aggregate) []any {
	types, ids := make([]string, len(skip)), make([]string, len(skip))
	for i, a := range skip {
		types[i], ids[i] = a.Type, a.ID
	}
	return []any{types, ids}
}

type claim struct {
	s     *Store
	tx    Tx
	rows  []outboxdriver.Row
	group *outboxdriver.ClaimGroup // nil: the single active relay, no fencing
}

// fenceArgs are the arguments of Statements.fence for the claim's leases.
func (c *claim) fenceArgs() []any {
	parts, epochs := make([]int16, len(c.group.Leases)), make([]int64, len(c.group.Leases))
	for i, l := range c.group.Leases {
		parts[i], epochs[i] = int16(l.Partition), l.Epoch
	}
	return []any{c.group.RelayID, parts, epochs}
}

func (c *claim) Rows() []outboxdriver.Row { return c.rows }

// KeepAlive implements outboxdriver.ClaimKeeper: a statement resets the server's
// idle-in-transaction clock.
func (c *claim) KeepAlive(ctx context.Context) error {
	if c.tx == nil {
		return nil
	}
	return InterpretError(c.tx.Exec(ctx, "SELECT 1"))
}

// Complete implements outboxdriver.Claim. When the claim's transaction cannot
// complete (it ended: the server's idle limit, a cut connection; or one of its
// statements failed: a row the dead letters cannot take), what the broker
// acknowledged is still marked, in a fresh transaction (settle).
func (c *claim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if c.tx == nil {
		return nil
	}
	tx := c.tx
	c.tx = nil
	err := c.write(ctx, tx, p)
	if err == nil {
		if err = tx.Commit(ctx); err == nil {
			return nil
		}
	} else {
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}
	if ctx.Err() != nil {
		return InterpretError(err)
	}
	if serr := outboxdriver.Settle(ctx, p, func(ctx context.Context, p *outboxdriver.CompleteParams) error {
		return c.settleTx(ctx, p, c.settleFence(len(p.Failed) > 0))
	}); serr != nil {
		return fmt.Errorf("%w (settling in a fresh transaction: %w)", InterpretError(err), InterpretError(serr))
	}
	return c.unpublished(ctx, p.Published)
}

// unpublished fails with ErrNotCompleted when rows of ids are still unpublished after
// a settle: its SKIP LOCKED passed rows another session held (an operator's lock, a
// reporting job's FOR SHARE), which the caller must not count as completed.
func (c *claim) unpublished(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	var n int
	if err := QueryRow(ctx, c.s.DB, `SELECT count(*) FROM `+c.s.Statements.qualified+` AS o
WHERE o.id = ANY($1::text[]::uuid[]) AND o.published_at IS NULL`, []any{ids}, &n); err != nil {
		return InterpretError(err)
	}
	if n > 0 {
		return fmt.Errorf("%w: %d of %d (another session held them when the claim's transaction had ended)", outboxdriver.ErrNotCompleted, n, len(ids))
	}
	return nil
}

// Settle implements outboxdriver.Settler: the rows Complete left out, written in
// fresh transactions under the claim fence, shared (the caller's claims skip their
// aggregates meanwhile).
func (c *claim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	return InterpretError(outboxdriver.Settle(ctx, p, func(ctx context.Context, p *outboxdriver.CompleteParams) error {
		return c.settleTx(ctx, p, sharedFence)
	}))
}

// write applies p in tx: marks (or deletes, or archives) the published rows, and
// records the failures.
func (c *claim) write(ctx context.Context, tx Tx, p *outboxdriver.CompleteParams) error {
	if len(p.Published) > 0 {
		st := c.s.Statements
		plain, fenced := st.markPublished, st.fencedMark
		switch p.Completion {
		case outboxdriver.CompleteDelete:
			plain, fenced = st.deletePublished, st.fencedDelete
		case outboxdriver.CompleteArchive:
			plain, fenced = st.archivePublished, st.fencedArchive
		}
		stmt, args := plain, []any{p.Published}
		if c.group != nil {
			stmt, args = fenced, append(args, c.fenceArgs()...)
		}
		if err := tx.Exec(ctx, stmt, args...); err != nil {
			return err
		}
	}
	if len(p.Failed) > 0 {
		return c.recordFailures(ctx, tx, p.Failed)
	}
	return nil
}

// settleFence is the claim fence a settling transaction takes. Marking what the
// broker acknowledged is safe beside any claim: shared. Recording a failure is not
// beside another relay's claim: it could claim the aggregate's later events past the
// failing row this transaction locks, so a single active relay's settle waits (a
// while) until no claim is in flight. A group's fenced statements need no more.
func (c *claim) settleFence(failures bool) string {
	if !failures || c.group != nil {
		return sharedFence
	}
	return "SELECT set_config('lock_timeout', '2s', true), pg_advisory_xact_lock($1)"
}

const sharedFence = "SELECT pg_advisory_xact_lock_shared($1)"

// settleTx applies p, restricted to the rows it may still touch
// (outboxdriver.CompleteParams.Restrict), in a transaction of its own under the
// claim fence taken by fence: the fallback of Complete, and Settle
// (outboxdriver.Settle).
func (c *claim) settleTx(ctx context.Context, p *outboxdriver.CompleteParams, fence string) error {
	tx, err := c.s.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.Exec(ctx, fence, c.s.Statements.claimFence); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT o.id::text, o.attempts FROM `+c.s.Statements.qualified+` AS o
WHERE o.id = ANY($1::text[]::uuid[]) AND o.published_at IS NULL FOR UPDATE OF o SKIP LOCKED`, p.IDs())
	if err != nil {
		return err
	}
	now, err := sqlrules.ScanAttempts(rows.Next, rows.Scan, rows.Err)
	rows.Close()
	if err != nil {
		return err
	}
	q := p.Restrict(c.rows, now)
	if err := c.write(ctx, tx, q); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// recordFailures counts attempts and schedules retries, and moves dead rows to the
// dead letters, in the claim's transaction.
func (c *claim) recordFailures(ctx context.Context, tx Tx, failed []outboxdriver.Failure) error {
	var (
		ids, errs   []string
		ns          []int32
		retries     []*time.Time
		dids, derrs []string
		dns         []int32
		holds       []bool
	)
	for _, f := range failed {
		n := int32(0)
		if f.CountAttempt {
			n = 1
		}
		if f.Dead {
			dids, derrs, dns, holds = append(dids, f.ID), append(derrs, f.Error), append(dns, n), append(holds, f.HoldKey)
			continue
		}
		ids, errs, ns, retries = append(ids, f.ID), append(errs, f.Error), append(ns, n), append(retries, availableAt(f.RetryAt))
	}
	failure, dead, fence := c.s.Statements.recordFailure, c.s.Statements.moveDead, []any(nil)
	if c.group != nil {
		failure, dead, fence = c.s.Statements.fencedFailure, c.s.Statements.fencedDead, c.fenceArgs()
	}
	if len(ids) > 0 {
		if err := tx.Exec(ctx, failure, append([]any{ids, errs, ns, retries}, fence...)...); err != nil {
			return err
		}
	}
	if len(dids) > 0 {
		if err := tx.Exec(ctx, dead, append([]any{dids, derrs, dns, holds}, fence...)...); err != nil {
			return err
		}
	}
	return nil
}

func (c *claim) Release(ctx context.Context) error {
	if c.tx == nil {
		return nil
	}
	tx := c.tx
	c.tx = nil
	return InterpretError(tx.Rollback(ctx))
}

// AcquireLeadership implements outboxdriver.Store with a session advisory lock held on
// a dedicated connection: if the relay dies, PostgreSQL closes the session and the
// lock is free for a standby at once.
//
// With params.Timeout, the lock's session is made to end on the server's side when
// the relay stops proving it is alive: idle_session_timeout (PostgreSQL 14+; the
// relay's heartbeats keep it busy well within it), and TCP keepalives plus
// tcp_user_timeout so a peer that vanished is noticed on older servers too. Without
// it, a paused relay or a half-open connection would keep the lock until the
// kernel's keepalive notices, over two hours by default.
func (s *Store) AcquireLeadership(ctx context.Context, params *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	var timeout time.Duration
	if params != nil {
		timeout = params.Timeout
	}
	return s.advisoryLock(ctx, "pg_try_advisory_lock", "pg_advisory_unlock", timeout)
}

// AcquireMembership implements outboxdriver.GroupStore: the same lock as the single
// active relay's, shared, so group members run together and never alongside a relay
// that is not in the group (nor a CDC relay).
func (s *Store) AcquireMembership(ctx context.Context) (outboxdriver.Leadership, error) {
	return s.advisoryLock(ctx, "pg_try_advisory_lock_shared", "pg_advisory_unlock_shared", 0)
}

func (s *Store) advisoryLock(ctx context.Context, try, unlock string, timeout time.Duration) (outboxdriver.Leadership, error) {
	sessions := s.DB
	if s.Sessions != nil {
		sessions = s.Sessions
	}
	conn, err := sessions.Conn(ctx)
	if err != nil {
		return nil, InterpretError(err)
	}
	shared, isShared := conn.(SharedConn)
	if isShared && !shared.Reserve(s.Statements.lockKey, try == "pg_try_advisory_lock", timeout) {
		return nil, conn.Close() // held by another relay of this process
	}
	if timeout > 0 {
		if err := sessionTimeouts(ctx, conn, timeout); err != nil {
			_ = conn.Close()
			return nil, InterpretError(err)
		}
	}
	var got bool
	if err := QueryRow(ctx, conn, "SELECT "+try+"($1)", []any{s.Statements.lockKey}, &got); err != nil {
		_ = conn.Close()
		return nil, InterpretError(err)
	}
	if !got {
		return nil, conn.Close()
	}
	if try == "pg_try_advisory_lock" {
		// The previous leader's claims can outlive its lock's session (each session's
		// silence counts from its own last call): wait until none holds the claim
		// fence, or this relay would claim past the rows they lock and publish an
		// aggregate's later events first. They end by their HoldTimeout.
		// On a session that several tables' leaderships share, the wait would stall
		// the others' checks behind it: a pool session waits instead (lock and
		// unlock in one statement, so any session does).
		var fence Querier = conn
		if isShared {
			fence = s.DB
		}
		if err := fence.Exec(ctx, "SELECT pg_advisory_lock($1), pg_advisory_unlock($1)", s.Statements.claimFence); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("waiting for the previous leader's claims to end: %w", InterpretError(err))
		}
	}
	return &leadership{conn: conn, key: s.Statements.lockKey, unlock: unlock}, nil
}

// sessionTimeouts makes the server end this session once its client shows no sign of
// life for about timeout: idle_session_timeout where the server has it (14+), and TCP
// keepalives with tcp_user_timeout (both ignored on a Unix socket).
func sessionTimeouts(ctx context.Context, conn Conn, timeout time.Duration) error {
	ms := strconv.FormatInt(timeout.Milliseconds(), 10)
	probe := strconv.Itoa(max(int(timeout/time.Second)/3, 1))
	return conn.Exec(ctx, `SELECT set_config(name, v, false) FROM (VALUES
  ('tcp_keepalives_idle', $2), ('tcp_keepalives_interval', '1'), ('tcp_keepalives_count', '3'), ('tcp_user_timeout', $1),
  ('idle_session_timeout', $1)) AS s(name, v)
WHERE EXISTS (SELECT 1 FROM pg_settings WHERE pg_settings.name = s.name)`, ms, probe)
}

type leadership struct {
	conn   Conn
	key    int64
	unlock string
}

func (l *leadership) Check(ctx context.Context) error {
	if l.conn == nil {
		return outboxdriver.ErrLeadershipLost
	}
	// A session advisory lock ends only with its session, so a live session means the
	// lock is still ours.
	if err := l.conn.Exec(ctx, "SELECT 1"); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", outboxdriver.ErrLeadershipLost, err) //nolint:errorlint // leadership is lost, whatever cut the connection: one sentinel to branch on
	}
	return nil
}

func (l *leadership) Release(ctx context.Context) error {
	if l.conn == nil {
		return nil
	}
	conn := l.conn
	l.conn = nil
	err := conn.Exec(ctx, "SELECT "+l.unlock+"($1)", l.key)
	if cerr := conn.Close(); err == nil {
		err = cerr
	}
	return err
}

// Listen implements outboxdriver.Store.
func (s *Store) Listen(ctx context.Context) (outboxdriver.Listener, error) {
	if s.ListenFunc == nil {
		return nil, outboxdriver.ErrNotSupported
	}
	return s.ListenFunc(ctx)
}

// CompletePublished implements outboxdriver.Completer: the statements a claim's
// Complete runs, unfenced (the CDC relay runs alone on its table).
func (s *Store) CompletePublished(ctx context.Context, ids []string, c outboxdriver.Completion) error {
	if len(ids) == 0 {
		return nil
	}
	stmt := s.Statements.markPublished
	switch c {
	case outboxdriver.CompleteDelete:
		stmt = s.Statements.deletePublished
	case outboxdriver.CompleteArchive:
		stmt = s.Statements.archivePublished
	}
	return InterpretError(s.DB.Exec(ctx, stmt, ids))
}

var _ outboxdriver.Completer = (*Store)(nil)

// Status implements outboxdriver.Store.
func (s *Store) Status(ctx context.Context) (*outboxdriver.Status, error) {
	st := &outboxdriver.Status{Table: s.Statements.table.String()}
	var ageSec float64
	var oldest *time.Time
	if err := QueryRow(ctx, s.DB, s.Statements.status, nil, &st.Unpublished, &ageSec, &st.Published, &st.Failing, &st.Dead, &st.HeldKeys, &oldest); err != nil {
		return nil, InterpretError(err)
	}
	if oldest != nil {
		st.OldestPublished = *oldest
	}
	st.OldestAge = time.Duration(ageSec * float64(time.Second))
	// Who holds the leadership lock: a session, so pg_stat_activity says who it is;
	// to a role without pg_read_all_stats it hides another role's session details
	// (NULL), but never its pid.
	rows, err := s.DB.Query(ctx, `SELECT a.pid, host(a.client_addr), a.application_name, a.backend_start, l.mode, coalesce(a.usename::text, '')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = (($1::bigint >> 32) & 4294967295) AND l.objid::bigint = ($1::bigint & 4294967295)
ORDER BY a.backend_start NULLS LAST, a.pid`, s.Statements.lockKey)
	if err != nil {
		return nil, InterpretError(err)
	}
	defer rows.Close()
	for n := 1; rows.Next(); n++ {
		var pid int
		var addr, app *string
		var mode, role string
		var since *time.Time
		if err := rows.Scan(&pid, &addr, &app, &since, &mode, &role); err != nil {
			return nil, InterpretError(err)
		}
		switch {
		case mode == "ShareLock": // members of a group of relays hold it shared
			st.ActiveRelay = fmt.Sprintf("%d relays in a group (see below)", n)
		case app == nil && since == nil:
			st.ActiveRelay = fmt.Sprintf("pid %d, role %s (another role's session: its details need pg_read_all_stats)", pid, role)
		default:
			// The role says who holds it: a relay's, or a squatter's (any role may take
			// an advisory lock: docs/security.md).
			st.ActiveRelay = fmt.Sprintf("pid %d on %s (%s), role %s", pid, orString(addr, "local"), orString(app, ""), role)
		}
		if n == 1 && since != nil {
			st.ActiveSince = *since
		}
	}
	if err := rows.Err(); err != nil {
		return nil, InterpretError(err)
	}
	rows.Close()
	if st.Slots, err = s.slots(ctx); err != nil {
		return nil, err
	}
	if err := s.groupStatus(ctx, st); err != nil {
		return nil, err
	}
	return st, nil
}

// slots reports the CDC relay's replication slots for the table.
func (s *Store) slots(ctx context.Context) ([]outboxdriver.SlotStatus, error) {
	rows, err := s.DB.Query(ctx, `SELECT c.slot, r.slot_name IS NOT NULL, coalesce(r.active, false), coalesce(r.wal_status, 'lost'),
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), r.restart_lsn), 0)::bigint,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), r.confirmed_flush_lsn), 0)::bigint,
       coalesce(r.safe_wal_size, -1)::bigint, c.backfilled_at IS NOT NULL
FROM `+s.Statements.cdc+` AS c LEFT JOIN pg_replication_slots AS r ON r.slot_name = c.slot ORDER BY c.slot`)
	if err != nil {
		return nil, InterpretError(err)
	}
	defer rows.Close()
	var out []outboxdriver.SlotStatus
	for rows.Next() {
		var ss outboxdriver.SlotStatus
		if err := rows.Scan(&ss.Name, &ss.Exists, &ss.Active, &ss.WALStatus, &ss.RetainedBytes, &ss.LagBytes, &ss.SafeBytes, &ss.Backfilled); err != nil {
			return nil, InterpretError(err)
		}
		out = append(out, ss)
	}
	return out, InterpretError(rows.Err())
}

// Cleanup implements outboxdriver.Store. The published_at condition is the guard: an
// unpublished row has none.
//
// On a partitioned table it first creates the coming days' partitions and drops whole
// days that are fully published and older than the cutoff.
func (s *Store) Cleanup(ctx context.Context, p *outboxdriver.CleanupParams) (int64, error) {
	var dropped int64
	// Partitioning is chosen at migration: ask the catalog, not the configuration.
	var partitioned bool
	if err := QueryRow(ctx, s.DB, `SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass($1))`,
		[]any{s.Statements.qualified}, &partitioned); err != nil {
		return 0, InterpretError(err)
	}
	if partitioned {
		if err := s.Statements.ensurePartitions(ctx, s.DB, time.Now()); err != nil {
			return 0, err
		}
		var err error
		if dropped, err = s.dropPublishedPartitions(ctx, p.Before); err != nil {
			return dropped, err
		}
	}
	var n int64
	// (tableoid, ctid): a ctid alone is ambiguous across the partitions of a table. In
	// published_at order, through the cleanup index: a read of the whole table
	// otherwise, every time no row is past the retention.
	err := QueryRow(ctx, s.DB, `WITH del AS (DELETE FROM `+s.Statements.qualified+` WHERE (tableoid, ctid) IN (
    SELECT tableoid, ctid FROM `+s.Statements.qualified+` WHERE published_at IS NOT NULL AND published_at < $1 ORDER BY published_at LIMIT $2)
  RETURNING 1)
SELECT count(*) FROM del`, []any{p.Before, p.Limit}, &n)
	if err != nil {
		return dropped + n, InterpretError(err)
	}
	// The archive (completion "archive"), in publication order: its BRIN index
	// finds the old end (on a partitioned table, what its default partition holds).
	var archived int64
	err = QueryRow(ctx, s.DB, `WITH del AS (DELETE FROM `+s.Statements.published+` WHERE (tableoid, ctid) IN (
    SELECT tableoid, ctid FROM `+s.Statements.published+` WHERE published_at < $1 LIMIT $2)
  RETURNING 1)
SELECT count(*) FROM del`, []any{p.Before, p.Limit}, &archived)
	return dropped + n + archived, InterpretError(err)
}

func orString(s *string, def string) string {
	if s == nil {
		return def
	}
	return *s
}
