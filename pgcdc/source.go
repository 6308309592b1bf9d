package pgcdc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// Errors callers branch on.
var (
	// ErrSlotLost means the replication slot is gone or PostgreSQL invalidated it
	// (wal_status = lost): WAL the relay had not confirmed may have been removed.
	// docs/cdc.md has the recovery; Config.RecreateSlot performs it.
	ErrSlotLost = errors.New("replication slot lost")
	// ErrForeignPublication: the publication named for this table publishes another
	// table; the relay refuses to start rather than read another table's WAL.
	ErrForeignPublication = fmt.Errorf("publication of another table: %w", outboxdriver.ErrNeedsOperator)
	// ErrWALLevel means the server's wal_level is not logical.
	ErrWALLevel = errors.New("wal_level must be logical for the CDC relay (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)")
)

// Defaults for Config.
const (
	MaxPendingDefault     = 10_000
	StatusIntervalDefault = time.Second
	ClaimLingerDefault    = time.Millisecond
)

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// DefaultSlot is the slot (and publication) name of a table when none is given:
// outbox_<schema>_<table> when that names the table unambiguously (a lowercase schema
// without '_', lowercase table, at most 63 bytes: public.outbox gives
// outbox_public_outbox), else that name cut short plus a hash of the exact
// schema-qualified name, so a.b_c and a_b.c (or Outbox and outbox) never share a slot.
func DefaultSlot(t outboxdriver.Table) string {
	t = t.WithDefaults()
	plain := "outbox_" + t.Schema + "_" + t.Name
	if !strings.Contains(t.Schema, "_") && plain == strings.ToLower(plain) && len(plain) <= outboxdriver.MaxIdentifierBytes {
		return plain
	}
	h := fnv.New32a()
	h.Write([]byte(t.Schema + "." + t.Name))
	base := strings.ToLower(plain)
	return fmt.Sprintf("%s_%08x", base[:min(len(base), outboxdriver.MaxIdentifierBytes-9)], h.Sum32())
}

// Config configures a Source.
type Config struct {
	// Slot is the replication slot ("" means outbox_<schema>_<table>, lowercased).
	// It is created on first start; one relay streams from it at a time.
	Slot string
	// Publication is the publication of the table's inserts ("" means the slot name).
	// It is created when missing.
	Publication string
	// MaxPending bounds the events read from the WAL and not yet acknowledged (memory
	// stays bounded whatever the size of a transaction). Default MaxPendingDefault.
	MaxPending int
	// StatusInterval is how often the confirmed position is reported to PostgreSQL.
	StatusInterval time.Duration
	// ClaimLinger is how long a claim that found only a few events waits for more
	// before handing them out. Default ClaimLingerDefault; negative: no wait.
	ClaimLinger time.Duration
	// RecreateSlot replaces a lost slot: a new one is created and every row still
	// unpublished in the table is published again (the documented recovery).
	RecreateSlot bool
	// FlowPastDeadLetters must match the relay's setting: whether the later events of
	// a dead letter's aggregate go on (true) or wait for it (false, the default).
	FlowPastDeadLetters bool
	// Logger receives the source's logs. Default: slog.Default().
	Logger *slog.Logger
	// Failpoint, for fault-injection tests only, is called at FailpointAfterReceive.
	Failpoint func(name string)
}

// Source is the relay's store in CDC mode: it reads the outbox events from the WAL
// (inserts into the table, and the table-less mode's logical messages) instead of
// polling the table. Everything else (dead letters, status, cleanup) is the table
// store's. Build it with New and hand it to relay.New like any store.
type Source struct {
	pool  *pgxpool.Pool
	inner outboxdriver.Store
	table outboxdriver.Table
	cfg   Config
	log   *slog.Logger

	qTable, qDead, qCDC string
	deadLetterStmt      string // set by checkServer, before any session
	bytesPayload        bool

	mu   sync.Mutex
	sess *session

	skipped atomic.Int64
}

// ForDriver returns the CDC source of an outboxpgx driver's table, on its pool and
// store. CDC builds on the driver; the driver knows nothing of it.
func ForDriver(d *outboxpgx.Driver, cfg *Config) (*Source, error) {
	if err := d.Err(); err != nil {
		return nil, err
	}
	store, err := d.Store()
	if err != nil {
		return nil, err
	}
	return New(d.Pool(), store, d.Table(), cfg)
}

// New returns a CDC source for the table of inner (the PostgreSQL store of the same
// table, on pool).
func New(pool *pgxpool.Pool, inner outboxdriver.Store, table outboxdriver.Table, cfg *Config) (*Source, error) {
	if pool == nil || inner == nil {
		return nil, outboxdriver.ErrNoPool
	}
	table = table.WithDefaults()
	if err := table.Validate(); err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Slot == "" {
		c.Slot = DefaultSlot(table)
	}
	if c.Publication == "" {
		c.Publication = c.Slot
	}
	if !slotNameRE.MatchString(c.Slot) || !slotNameRE.MatchString(c.Publication) {
		return nil, fmt.Errorf("%w: slot and publication names must match %s (got %q, %q)",
			outboxdriver.ErrInvalidIdentifier, slotNameRE, c.Slot, c.Publication)
	}
	if c.MaxPending == 0 {
		c.MaxPending = MaxPendingDefault
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = StatusIntervalDefault
	}
	if c.ClaimLinger == 0 {
		c.ClaimLinger = ClaimLingerDefault
	}
	if c.MaxPending < 1 || c.StatusInterval < 0 {
		return nil, errors.New("pgcdc: MaxPending must be positive and StatusInterval not negative")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Failpoint == nil {
		c.Failpoint = func(string) {}
	}
	s := &Source{pool: pool, inner: inner, table: table, cfg: c, log: c.Logger,
		qTable: pgx.Identifier{table.Schema, table.Name}.Sanitize(),
		// The dead letters and the CDC bookkeeping are the migrations' tables
		// (002 and 003 of the PostgreSQL driver).
		qDead: pgx.Identifier{table.Schema, table.Derived("_dead")}.Sanitize(),
		qCDC:  pgx.Identifier{table.Schema, table.Derived("_cdc")}.Sanitize(),
	}
	return s, nil
}

var _ outboxdriver.Source = (*Source)(nil)

// deadLetterStatement inserts dead letters from arrays, for a jsonb or bytea payload.
func deadLetterStatement(table, dead string, bytesPayload bool) string {
	arg, expr := "text", "p::jsonb"
	if bytesPayload {
		arg, expr = "bytea", "p"
	}
	// The row (rows mode) leaves the table in the same statement, so a replay can
	// insert it again and a backfill never sees it.
	return `WITH gone AS (DELETE FROM ` + table + ` WHERE id = ANY($1::uuid[]))
INSERT INTO ` + dead + ` (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, seq, created_at, attempts, error, holds_key)
SELECT id, at, aid, t, ` + expr + `, h::jsonb, tc, seq, coalesce(ca, now()), n, err, hold
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::` + arg + `[], $6::text[], $7::text[],
            $8::bigint[], $9::timestamptz[], $10::int[], $11::text[], $12::bool[]) AS u(id, at, aid, t, p, h, tc, seq, ca, n, err, hold)
ON CONFLICT (id) DO NOTHING`
}

// Slot returns the replication slot's name.
func (s *Source) Slot() string { return s.cfg.Slot }

// Skipped is how many WAL messages with the outbox prefix could not be decoded into an
// event (each is logged with its position).
func (s *Source) Skipped() int64 { return s.skipped.Load() }

// session is one leadership term: a replication connection and its queue.
type session struct {
	src           *Source
	lead          outboxdriver.Leadership // the table's single-active-relay lock
	q             *queue
	st            *stream
	cancel        context.CancelFunc
	done          chan struct{}
	err           atomic.Pointer[error]
	backfilling   atomic.Bool // still publishing the rows written before the slot
	backfillUntil int64       // the backfill's last seq

	heldMu sync.Mutex
	held   map[string]bool
}

// AcquireLeadership implements outboxdriver.Source: the table's relay lock (so a poll
// relay and a CDC relay never run at once), then the slot. A standby retries. With
// params.Timeout, the replication connection also runs with that
// wal_sender_timeout: PostgreSQL ends the stream of a relay that stopped sending
// status updates (paused, cut off), so the slot is free for the standby as soon as
// the table lock is.
func (s *Source) AcquireLeadership(ctx context.Context, params *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	lead, err := s.inner.AcquireLeadership(ctx, params)
	if err != nil || lead == nil {
		return nil, err
	}
	var timeout time.Duration
	if params != nil {
		timeout = params.Timeout
	}
	sess, err := s.start(ctx, lead, timeout)
	if err != nil || sess == nil {
		_ = lead.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	return sess, nil
}

type slotInfo struct {
	exists, active bool
	walStatus      string
	confirmed      pglogrepl.LSN
}

func (s *Source) slotInfo(ctx context.Context) (slotInfo, error) {
	var si slotInfo
	var confirmed *string
	err := s.pool.QueryRow(ctx, `SELECT active, coalesce(wal_status, ''), confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
		s.cfg.Slot).Scan(&si.active, &si.walStatus, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return si, nil
	}
	if err != nil {
		return si, err
	}
	si.exists = true
	if confirmed != nil {
		si.confirmed, err = pglogrepl.ParseLSN(*confirmed)
	}
	return si, err
}

// start prepares the publication and the slot and starts streaming. It returns nil
// when another session streams from the slot.
func (s *Source) start(ctx context.Context, lead outboxdriver.Leadership, timeout time.Duration) (*session, error) {
	if err := s.checkServer(ctx); err != nil {
		return nil, err
	}
	if err := s.ensurePublication(ctx); err != nil {
		return nil, err
	}
	si, err := s.slotInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: slot: %w", err)
	}
	if si.active {
		return nil, nil // a session of a relay that just died, until PostgreSQL notices
	}
	var registered bool
	var backfilled *time.Time
	var until *int64
	err = s.pool.QueryRow(ctx, `SELECT backfilled_at, backfill_until FROM `+s.qCDC+` WHERE slot = $1`, s.cfg.Slot).Scan(&backfilled, &until)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("pgcdc: %w", interpret(err))
	default:
		registered = true
	}
	lost := (si.exists && si.walStatus == "lost") || (!si.exists && registered && backfilled != nil)
	if lost && !s.cfg.RecreateSlot {
		return nil, fmt.Errorf("%w (%w): slot %q (wal_status %q): events written since its last confirmed position may be gone from the WAL; "+
			"recover with `outbox relay --mode cdc --recreate-slot` (docs/cdc.md)", ErrSlotLost, outboxdriver.ErrNeedsOperator, s.cfg.Slot, map[bool]string{true: si.walStatus, false: "dropped"}[si.exists])
	}

	conn, err := s.connect(ctx, timeout)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	if lost {
		s.log.Warn("pgcdc: recreating the lost replication slot; every unpublished row in the table will be published again", "slot", s.cfg.Slot)
		if si.exists {
			if err := pglogrepl.DropReplicationSlot(ctx, conn, s.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
				return nil, fmt.Errorf("pgcdc: drop lost slot: %w", err)
			}
		}
		si = slotInfo{}
	}
	if !si.exists {
		if si.confirmed, err = s.createSlot(ctx, conn); err != nil {
			return nil, err
		}
		backfilled, until = nil, nil // read again below
	} else if !registered {
		// A slot made by hand: publish the rows before it too (duplicates, never a gap).
		if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.qCDC+` (slot) VALUES ($1) ON CONFLICT DO NOTHING`, s.cfg.Slot); err != nil {
			return nil, fmt.Errorf("pgcdc: %w", interpret(err))
		}
	}
	sess := &session{src: s, lead: lead, q: newQueue(s.cfg.MaxPending), done: make(chan struct{})}
	sess.q.confirmed = uint64(si.confirmed)
	if backfilled == nil {
		// A relay that died between creating the slot and recording its backfill
		// bound: take today's maximum (duplicates, never a gap).
		if until == nil {
			var n int64
			if err := s.pool.QueryRow(ctx, `WITH m AS (SELECT coalesce(max(seq), 0) AS n FROM `+s.qTable+`)
UPDATE `+s.qCDC+` SET backfill_until = coalesce(backfill_until, m.n) FROM m WHERE slot = $1 RETURNING backfill_until`, s.cfg.Slot).Scan(&n); err != nil {
				return nil, fmt.Errorf("pgcdc: %w", interpret(err))
			}
			until = &n
		}
		sess.backfillUntil = *until
		sess.backfilling.Store(*until > 0)
		if *until == 0 {
			if err := sess.finishBackfill(ctx); err != nil {
				return nil, err
			}
		}
	}
	if err := sess.loadHeld(ctx); err != nil {
		return nil, err
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: pluginArgs(s.cfg.Publication)})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: another session streams
			return nil, nil
		}
		return nil, fmt.Errorf("pgcdc: start replication: %w", err)
	}
	ok = true
	st := &stream{conn: conn, dec: NewDecoder(s.table, s.table.MessagePrefix), q: sess.q, statusEvery: s.cfg.StatusInterval,
		log: s.log, failpoint: s.cfg.Failpoint, bad: func(lsn uint64, err error) {
			s.skipped.Add(1)
			s.log.Error("pgcdc: skipping a WAL message that is not an outbox event", "lsn", pglogrepl.LSN(lsn), "err", err)
		}}
	sess.st = st
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sess.cancel = cancel
	go func() {
		defer close(sess.done)
		err := st.run(runCtx)
		if err != nil {
			sess.err.Store(&err)
		}
		sess.q.close()
		st.close()
	}()
	s.log.Info("pgcdc: streaming", "slot", s.cfg.Slot, "from", si.confirmed, "backfill_until_seq", sess.backfillUntil)
	return sess, nil
}

// Init creates the publication and the replication slot when they are missing, so
// that events written from now on are captured even before a relay first runs. The
// insert-delete and table-less write modes leave nothing in the table for a backfill:
// run Init (`outbox migrate --cdc`) before their producers start.
func (s *Source) Init(ctx context.Context) error {
	if err := s.checkServer(ctx); err != nil {
		return err
	}
	if err := s.ensurePublication(ctx); err != nil {
		return err
	}
	si, err := s.slotInfo(ctx)
	if err != nil || si.exists {
		return err
	}
	conn, err := s.connect(ctx, 0)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = s.createSlot(ctx, conn)
	return err
}

// checkServer refuses a server without logical decoding, warns when slots may keep
// WAL without limit, and learns the payload column's type for the dead letters.
func (s *Source) checkServer(ctx context.Context) error {
	var walLevel, keep, payloadType string
	err := s.pool.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_slot_wal_keep_size'),
  (SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'payload')`, s.qDead).Scan(&walLevel, &keep, &payloadType)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if walLevel != "logical" {
		return fmt.Errorf("%w (it is %s; %w)", ErrWALLevel, walLevel, outboxdriver.ErrNeedsOperator)
	}
	if keep == "-1" {
		s.log.Warn("pgcdc: max_slot_wal_keep_size is unset: a stopped relay's slot keeps WAL without limit; set it and watch the slot lag",
			"slot", s.cfg.Slot)
	}
	s.bytesPayload = payloadType == "bytea"
	s.deadLetterStmt = deadLetterStatement(s.qTable, s.qDead, s.bytesPayload)
	return nil
}

func (s *Source) connect(ctx context.Context, walSenderTimeout time.Duration) (*pgconn.PgConn, error) {
	rcfg := s.pool.Config().ConnConfig.Config.Copy()
	if rcfg.RuntimeParams == nil {
		rcfg.RuntimeParams = map[string]string{}
	}
	rcfg.RuntimeParams["replication"] = "database"
	rcfg.RuntimeParams["application_name"] = "outbox relay (cdc)"
	if walSenderTimeout > 0 {
		rcfg.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(walSenderTimeout.Milliseconds(), 10)
	}
	conn, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: replication connection: %w", err)
	}
	return conn, nil
}

// createSlot registers and creates the slot and returns its consistent point.
func (s *Source) createSlot(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	// Register first: if the relay dies right after creating the slot, the next
	// start still knows the rows before it need publishing.
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.qCDC+` (slot) VALUES ($1)
ON CONFLICT (slot) DO UPDATE SET created_at = now(), backfill_until = NULL, backfilled_at = NULL`, s.cfg.Slot); err != nil {
		return 0, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, s.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		return 0, fmt.Errorf("pgcdc: create slot %q: %w", s.cfg.Slot, err)
	}
	s.log.Info("pgcdc: replication slot created", "slot", s.cfg.Slot, "consistent_point", res.ConsistentPoint)
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("pgcdc: %w", err)
	}
	// Every row committed before the slot existed has a seq at most this (a later
	// maximum would only add duplicates).
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.qCDC+` SET backfill_until = (SELECT coalesce(max(seq), 0) FROM `+s.qTable+`)
WHERE slot = $1`, s.cfg.Slot); err != nil {
		return 0, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	return lsn, nil
}

func (s *Source) ensurePublication(ctx context.Context) error {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, s.cfg.Publication).Scan(&n); err != nil {
		return fmt.Errorf("pgcdc: %w", err)
	}
	if n > 0 {
		return s.checkPublication(ctx)
	}
	_, err := s.pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{s.cfg.Publication}.Sanitize()+` FOR TABLE `+s.qTable+
		` WITH (publish = 'insert', publish_via_partition_root = true)`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created meanwhile by another relay
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgcdc: create publication: %w", interpret(err))
	}
	return nil
}

// checkPublication refuses a publication that does not publish this table's inserts,
// or that publishes another table too: a slot and publication named for another table
// would have this relay stream (and confirm past) WAL that is not its own, while its
// own rows were never read.
func (s *Source) checkPublication(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1`, s.cfg.Publication)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", err)
	}
	var others []string
	ours := false
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			rows.Close()
			return fmt.Errorf("pgcdc: %w", err)
		}
		if schema == s.table.Schema && (name == s.table.Name || strings.HasPrefix(name, s.table.Name+"_p")) {
			ours = true
			continue
		}
		others = append(others, schema+"."+name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgcdc: %w", err)
	}
	if !ours || len(others) > 0 {
		return fmt.Errorf("%w: publication %q publishes %v, not only %s: it belongs to another table (name this table's slot and publication with --slot/--publication)",
			ErrForeignPublication, s.cfg.Publication, others, s.table)
	}
	return nil
}

func interpret(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("%w: %s", outboxdriver.ErrTableMissing, pgErr.Message)
	}
	return err
}

// Check implements outboxdriver.Leadership.
func (ss *session) Check(ctx context.Context) error {
	if err := ss.lead.Check(ctx); err != nil {
		return err
	}
	if errp := ss.err.Load(); errp != nil {
		return fmt.Errorf("%w: %w", outboxdriver.ErrLeadershipLost, *errp)
	}
	select {
	case <-ss.done:
		return fmt.Errorf("%w: replication stream ended", outboxdriver.ErrLeadershipLost)
	default:
	}
	return nil
}

// Release implements outboxdriver.Leadership: the stream reports its last confirmed
// position and closes, then the table lock goes.
func (ss *session) Release(ctx context.Context) error {
	ss.cancel()
	select {
	case <-ss.done:
	case <-ctx.Done():
	}
	ss.src.mu.Lock()
	if ss.src.sess == ss {
		ss.src.sess = nil
	}
	ss.src.mu.Unlock()
	return ss.lead.Release(ctx)
}

func (s *Source) current() *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess
}

// Claim implements outboxdriver.Source. While the rows written before the slot are
// being published it claims them from the table; then it hands out events from the
// WAL in commit order, holding back an aggregate behind its waiting event.
func (s *Source) Claim(ctx context.Context, p *outboxdriver.ClaimParams) (outboxdriver.Claim, error) {
	ss := s.current()
	if ss == nil {
		return nil, outboxdriver.ErrLeadershipLost
	}
	if ss.backfilling.Load() {
		c, err := s.inner.Claim(ctx, &outboxdriver.ClaimParams{Limit: p.Limit, MaxBytes: p.MaxBytes, MaxSeq: ss.backfillUntil})
		if err != nil || len(c.Rows()) > 0 {
			return c, err
		}
		if err := ss.finishBackfill(ctx); err != nil {
			return nil, err
		}
		if ss.backfilling.Load() {
			return c, nil // rows still wait for a retry
		}
	}
	for lingered := false; ; {
		out, held := ss.q.take(p.Limit, time.Now(), ss.holds)
		if len(held) == 0 && len(out) > 0 && len(out) < p.Limit && !lingered && s.cfg.ClaimLinger > 0 {
			// A trickle: wait a moment for the rest of the transaction and its
			// neighbours, so a batch is not one event (per-event batches cost a
			// round of wake-ups in the relay, the broker and the walsender each).
			ss.q.giveBack(out)
			lingered = true
			t := time.NewTimer(s.cfg.ClaimLinger)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		if len(held) == 0 {
			return &claim{ss: ss, es: out}, nil
		}
		// Give the events back before the database work: the next take starts over.
		ss.q.giveBack(out)
		if err := ss.deadLetter(ctx, held); err != nil {
			ss.q.giveBack(held)
			return nil, err
		}
	}
}

// finishBackfill ends the backfill once no row before the slot waits any more.
func (ss *session) finishBackfill(ctx context.Context) error {
	s := ss.src
	var left bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.qTable+` AS o WHERE o.published_at IS NULL AND o.seq <= $1
  AND NOT EXISTS (SELECT 1 FROM `+s.qDead+` AS d WHERE d.holds_key AND d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid))`,
		ss.backfillUntil).Scan(&left)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if left {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.qCDC+` SET backfilled_at = now() WHERE slot = $1`, s.cfg.Slot); err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if ss.backfilling.Swap(false) {
		s.log.Info("pgcdc: rows written before the slot are published; streaming from the WAL", "slot", s.cfg.Slot)
	}
	return nil
}

func (ss *session) loadHeld(ctx context.Context) error {
	rows, err := ss.src.pool.Query(ctx, `SELECT DISTINCT aggregatetype, aggregateid FROM `+ss.src.qDead+` WHERE holds_key`)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	ss.held = map[string]bool{}
	for rows.Next() {
		var r outboxdriver.Row
		if err := rows.Scan(&r.AggregateType, &r.AggregateID); err != nil {
			rows.Close()
			return err
		}
		ss.held[aggregateKey(&r)] = true
	}
	return rows.Err()
}

// holds reports whether a dead letter holds the aggregate (as far as this relay
// knows; deadLetter asks the database again before it acts on it).
func (ss *session) holds(key string) bool {
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	return ss.held[key]
}

// deadLetter moves events that must not be published now to the dead letters: rejected
// ones (dead, holding their aggregate unless FlowPastDeadLetters), and those of an
// aggregate a dead letter holds (waiting there in order; replaying the aggregate
// brings them back). An aggregate whose dead letters were replayed or purged since
// is released and its events go back to the queue.
func (ss *session) deadLetter(ctx context.Context, es []*entry) error {
	var dead []deadEntry
	var back []*entry
	stillHeld := map[string]bool{}
	var done []*entry
	for _, e := range es {
		key := aggregateKey(&e.row)
		if e.reject != nil {
			dead = append(dead, deadEntry{e, e.reject.Error(), !ss.src.cfg.FlowPastDeadLetters})
			done = append(done, e)
			continue
		}
		held, ok := stillHeld[key]
		if !ok {
			if err := ss.src.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+ss.src.qDead+` WHERE holds_key AND aggregatetype = $1 AND aggregateid = $2)`,
				e.row.AggregateType, e.row.AggregateID).Scan(&held); err != nil {
				return fmt.Errorf("pgcdc: %w", err)
			}
			stillHeld[key] = held
		}
		if !held {
			back = append(back, e)
			continue
		}
		dead = append(dead, deadEntry{e, "waiting behind a dead letter of its aggregate (replay the aggregate to publish it)", false})
		done = append(done, e)
	}
	if err := ss.src.insertDead(ctx, dead); err != nil {
		return err
	}
	ss.heldMu.Lock()
	for key, held := range stillHeld {
		if !held {
			delete(ss.held, key)
		}
	}
	for _, d := range dead {
		if d.hold {
			ss.held[aggregateKey(&d.e.row)] = true
		}
	}
	ss.heldMu.Unlock()
	ss.q.giveBack(back)
	ss.q.done(done)
	return nil
}

type deadEntry struct {
	e    *entry
	err  string
	hold bool
}

// insertDead writes events into the dead letters from memory (in CDC mode the row
// may not exist: the insert-delete and table-less modes keep none).
func (s *Source) insertDead(ctx context.Context, ds []deadEntry) error {
	n := len(ds)
	if n == 0 {
		return nil
	}
	ids, ats, aids, types, tcs, errs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]*string, n), make([]string, n)
	headers := make([]*string, n)
	seqs, attempts, holds := make([]int64, n), make([]int32, n), make([]bool, n)
	created := make([]*time.Time, n)
	var payloads any
	textPayloads, bytePayloads := make([]*string, n), make([][]byte, n)
	for i, d := range ds {
		r := &d.e.row
		ids[i], ats[i], aids[i], types[i], errs[i] = r.ID, r.AggregateType, r.AggregateID, r.Type, d.err
		seqs[i], attempts[i], holds[i] = r.Seq, int32(r.Attempts), d.hold
		if r.TraceContext != "" {
			tcs[i] = &r.TraceContext
		}
		if r.Headers != nil {
			b, _ := json.Marshal(r.Headers)
			h := string(b)
			headers[i] = &h
		}
		if !r.CreatedAt.IsZero() {
			created[i] = &r.CreatedAt
		}
		if !r.PayloadNull {
			p := string(r.Payload)
			textPayloads[i] = &p
			bytePayloads[i] = nonNil(r.Payload)
		}
	}
	payloads = textPayloads
	if s.bytesPayload {
		payloads = bytePayloads
	}
	_, err := s.pool.Exec(ctx, s.deadLetterStmt, ids, ats, aids, types, payloads, headers, tcs, seqs, created, attempts, errs, holds)
	if err != nil {
		return fmt.Errorf("pgcdc: dead letters: %w", interpret(err))
	}
	for _, d := range ds {
		s.log.Error("relay: event moved to the dead letters", "id", d.e.row.ID, "aggregatetype", d.e.row.AggregateType,
			"aggregateid", d.e.row.AggregateID, "holds_key", d.hold, "err", d.err)
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// claim is a batch of events handed to the relay.
type claim struct {
	ss   *session
	es   []*entry
	rows []outboxdriver.Row
	once bool
}

func (c *claim) Rows() []outboxdriver.Row {
	if c.rows == nil && len(c.es) > 0 {
		c.rows = make([]outboxdriver.Row, len(c.es))
		for i, e := range c.es {
			c.rows[i] = e.row
		}
	}
	return c.rows
}

// Complete implements outboxdriver.Claim: acknowledged events are done (their
// position becomes confirmable), dead ones go to the dead letters first, and failed
// ones wait in the queue, in order, for their retry time.
func (c *claim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if c.once {
		return nil
	}
	c.once = true
	byID := make(map[string]*entry, len(c.es))
	for _, e := range c.es {
		byID[e.row.ID] = e
	}
	var dead []deadEntry
	var back []*entry
	failed := map[*entry]bool{}
	for _, f := range p.Failed {
		e := byID[f.ID]
		if e == nil {
			continue
		}
		failed[e] = true
		if f.CountAttempt {
			e.row.Attempts++
		}
		if f.Dead {
			dead = append(dead, deadEntry{e, f.Error, f.HoldKey})
			continue
		}
		e.availableAt = f.RetryAt
		back = append(back, e)
	}
	if err := c.ss.src.insertDead(ctx, dead); err != nil {
		// Not done: the events come again after a restart; never confirmed unsent.
		c.ss.q.giveBack(back)
		return err
	}
	if len(dead) > 0 {
		c.ss.heldMu.Lock()
		for _, d := range dead {
			if d.hold {
				c.ss.held[aggregateKey(&d.e.row)] = true
			}
		}
		c.ss.heldMu.Unlock()
	}
	done := make([]*entry, 0, len(c.es))
	for _, e := range c.es {
		if !failed[e] {
			done = append(done, e) // published (an id the broker acked)
		}
	}
	for _, d := range dead {
		done = append(done, d.e)
	}
	c.ss.q.giveBack(back)
	c.ss.q.done(done)
	// Report now, before the relay sends its next batch. A failed write ends the
	// stream, and the relay steps down.
	if err := c.ss.st.sendStatus(false); err != nil {
		c.ss.src.log.Warn("pgcdc: could not report the confirmed position", "err", err)
	}
	return nil
}

// Release implements outboxdriver.Claim: the events go back, in order.
func (c *claim) Release(context.Context) error {
	if c.once {
		return nil
	}
	c.once = true
	c.ss.q.giveBack(c.es)
	return nil
}

// Listen implements outboxdriver.Source: the relay wakes up as soon as the stream
// queued something.
func (s *Source) Listen(ctx context.Context) (outboxdriver.Listener, error) {
	ss := s.current()
	if ss == nil {
		return nil, outboxdriver.ErrLeadershipLost
	}
	return listener{ss.q}, nil
}

type listener struct{ q *queue }

func (l listener) Wait(ctx context.Context) error {
	select {
	case <-l.q.avail:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (listener) Close(context.Context) error { return nil }

// Cleanup implements outboxdriver.Source. In CDC mode rows are not marked when
// published (the WAL, not the row, is what is relayed), so every row older than the
// retention goes, unless it waits for the backfill.
func (s *Source) Cleanup(ctx context.Context, p *outboxdriver.CleanupParams) (int64, error) {
	ss := s.current()
	if ss == nil || ss.backfilling.Load() {
		return s.inner.Cleanup(ctx, p)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.qTable+` WHERE seq IN (SELECT seq FROM `+s.qTable+
		` WHERE created_at < $1 AND (published_at IS NOT NULL OR seq > $3) ORDER BY seq LIMIT $2)`, p.Before, p.Limit, ss.backfillUntil)
	if err != nil {
		return 0, fmt.Errorf("pgcdc: cleanup: %w", interpret(err))
	}
	return tag.RowsAffected(), nil
}
