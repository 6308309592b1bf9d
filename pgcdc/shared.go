package pgcdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/outboxdriver"
)

// ParkAfterDefault is SharedConfig.ParkAfter's default.
const ParkAfterDefault = 5 * time.Second

// SharedSlotDefault is the slot (and publication) of a Shared stream when none is
// given.
const SharedSlotDefault = "outbox_tables"

// MaxSpilledDefault is SharedConfig.MaxSpilled's default.
const MaxSpilledDefault = 100_000

// SharedConfig configures a Shared stream.
type SharedConfig struct {
	// Slot is the replication slot every table is read from ("" means
	// SharedSlotDefault). One process streams from it at a time.
	Slot string
	// Publication is the publication of every table's inserts ("" means the slot
	// name). Tables join and leave it as they are added and removed.
	Publication string
	// MaxPending, MaxPendingBytes, StatusInterval, ClaimLinger, RecreateSlot and
	// Logger are Config's, for the stream and every table.
	MaxPending      int
	MaxPendingBytes int
	// MaxSpilled is how many events more than MaxPending the stream may hold without
	// their payloads once its room is full: inserted rows of a table, which their
	// claims read from the table again. So one table's transaction larger than
	// MaxPending does not hold back the other tables' events committed after it,
	// while its own relay works through it (docs/cdc.md, "Fairness"). A table-less or
	// insert-delete event has no row to read again: it waits for room. Default
	// MaxSpilledDefault (about 400 bytes of memory each); negative: none.
	MaxSpilled     int
	StatusInterval time.Duration
	ClaimLinger    time.Duration
	RecreateSlot   bool
	Logger         *slog.Logger
	// Timeout is the replication connection's wal_sender_timeout: PostgreSQL ends the
	// stream of a process that stopped answering, so that a standby can take the
	// slot over (0: the server's).
	Timeout time.Duration
	// Direct is a pool straight to PostgreSQL whose settings the replication
	// connection takes, when the Shared's pool goes through a transaction-pooling
	// proxy (PgBouncer), which cannot carry replication (nil: the Shared's pool).
	Direct *pgxpool.Pool
	// ParkAfter is how long reading may wait for one table that holds the most
	// events and gets none of them done (its relay cannot lead, its broker refuses
	// them): past it the table is parked, so the stream reads on for the others. A
	// parked table's later events are skipped, the slot's position stays before
	// them, and once its relay has caught up the stream is read again from the
	// slot's position (each other table skipping what it had done). Default
	// ParkAfterDefault; negative: never.
	ParkAfter time.Duration
	// Retry is how often a standby (or a stream that failed) tries the slot again.
	// Default one second.
	Retry time.Duration
	// Match reports whether a table is one this process relays, though not added
	// (yet): when the stream carries an event of such a table, Rescan runs before
	// the event is read on, so that the table is added and nothing of it is
	// confirmed unread. Nil: only added tables.
	Match func(outboxdriver.Table) bool
	// Rescan looks for the tables Match matches and adds them (see Match).
	Rescan func(ctx context.Context) error
}

// Shared is one replication slot and one publication for many outbox tables: one
// replication connection however many tables there are, and one position confirmed
// for all of them (the furthest before which every table's events are done). Each
// table is a Source of its own (Add), relayed by a relay of its own with its own
// leadership, order per aggregate, dead letters and completion, exactly as a table
// alone; Run streams for all of them. A process that cannot take the slot (another
// streams from it) is a standby for every table.
type Shared struct {
	pool *pgxpool.Pool
	cfg  SharedConfig
	log  *slog.Logger

	mu       sync.Mutex
	byTable  map[string]*Source // by schema.name
	byPrefix map[string]*Source // by logical message prefix
	declined map[string]time.Time
	term     *term
	queues   map[*Source]*queue // the current term's

	skipped atomic.Int64
	terms   atomic.Int64 // streams started
	warned  atomic.Bool  // of unbounded WAL, once
}

// declinedFor is how long an event of a table that Match matched and Rescan did not
// add (a table dropped since) is skipped without asking again.
const declinedFor = 10 * time.Second

// NewShared returns a shared stream on pool. Add its tables, then Run it.
func NewShared(pool *pgxpool.Pool, cfg *SharedConfig) (*Shared, error) {
	if pool == nil {
		return nil, outboxdriver.ErrNoPool
	}
	var c SharedConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Slot == "" {
		c.Slot = SharedSlotDefault
	}
	if c.Publication == "" {
		c.Publication = c.Slot
	}
	if !slotNameRE.MatchString(c.Slot) || !slotNameRE.MatchString(c.Publication) {
		return nil, fmt.Errorf("%w: slot and publication names must match %s (got %q, %q)",
			outboxdriver.ErrInvalidIdentifier, slotNameRE, c.Slot, c.Publication)
	}
	if c.Retry <= 0 {
		c.Retry = time.Second
	}
	c.MaxPending = cmp.Or(c.MaxPending, MaxPendingDefault)
	c.MaxPendingBytes = cmp.Or(c.MaxPendingBytes, MaxPendingBytesDefault)
	c.MaxSpilled = max(cmp.Or(c.MaxSpilled, MaxSpilledDefault), 0)
	c.StatusInterval = cmp.Or(c.StatusInterval, StatusIntervalDefault)
	c.ClaimLinger = cmp.Or(c.ClaimLinger, ClaimLingerDefault)
	c.ParkAfter = cmp.Or(c.ParkAfter, ParkAfterDefault)
	if c.MaxPending < 1 || c.StatusInterval < 0 {
		return nil, errors.New("pgcdc: MaxPending must be positive and StatusInterval not negative")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Shared{pool: pool, cfg: c, log: c.Logger.With("slot", c.Slot),
		byTable: map[string]*Source{}, byPrefix: map[string]*Source{}, declined: map[string]time.Time{}}, nil
}

// Slot returns the replication slot's name.
func (sh *Shared) Slot() string { return sh.cfg.Slot }

// Publication returns the publication's name.
func (sh *Shared) Publication() string { return sh.cfg.Publication }

// Add adds table (inner is its PostgreSQL store, on the Shared's pool) to the
// publication and returns its Source, for a relay of its own. Adding a table twice
// returns its Source again. A table that joins a slot that already streams first
// publishes the rows written before it joined (its backfill), then its events
// from the WAL.
func (sh *Shared) Add(ctx context.Context, inner outboxdriver.Store, table outboxdriver.Table) (*Source, error) {
	table = table.WithDefaults()
	sh.mu.Lock()
	s := sh.byTable[table.String()]
	sh.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := New(sh.pool, inner, table, &Config{Slot: sh.cfg.Slot, Publication: sh.cfg.Publication,
		MaxPending: sh.cfg.MaxPending, MaxPendingBytes: sh.cfg.MaxPendingBytes, StatusInterval: sh.cfg.StatusInterval,
		ClaimLinger: sh.cfg.ClaimLinger, RecreateSlot: sh.cfg.RecreateSlot, Logger: sh.cfg.Logger.With("table", table.String())})
	if err != nil {
		return nil, err
	}
	s.shared = sh
	if err := s.checkServer(ctx); err != nil {
		return nil, err
	}
	if err := s.loadDone(ctx); err != nil {
		return nil, err
	}
	// Routed before it joins the publication: none of its events can come unrouted.
	sh.mu.Lock()
	sh.byTable[table.String()] = s
	sh.byPrefix[table.MessagePrefix] = s
	delete(sh.declined, table.String())
	delete(sh.declined, table.MessagePrefix)
	sh.mu.Unlock()
	if err := sh.publish(ctx, s); err != nil {
		sh.forget(s)
		return nil, err
	}
	return s, nil
}

// publish registers the table with the slot (its backfill bound is taken when its
// relay first leads, after it joined) and adds it to the publication, created when
// missing.
func (sh *Shared) publish(ctx context.Context, s *Source) error {
	if _, err := sh.pool.Exec(ctx, `INSERT INTO `+s.qCDC+` (slot) VALUES ($1) ON CONFLICT DO NOTHING`, sh.cfg.Slot); err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if err := sh.ensurePublication(ctx); err != nil {
		return err
	}
	var member bool
	err := sh.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
  WHERE p.pubname = $1 AND r.prrelid = $2::regclass)`, sh.cfg.Publication, s.qTable).Scan(&member)
	if err != nil || member {
		return interpretErr(err)
	}
	_, err = sh.pool.Exec(ctx, `ALTER PUBLICATION `+pgx.Identifier{sh.cfg.Publication}.Sanitize()+` ADD TABLE `+s.qTable)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // added meanwhile by another process
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgcdc: publication %s: %w", sh.cfg.Publication, interpret(err))
	}
	return nil
}

func interpretErr(err error) error {
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	return nil
}

// ensurePublication creates the publication, of no table yet, when missing: the
// stream of a slot needs its publication, and tables join it as they are added.
func (sh *Shared) ensurePublication(ctx context.Context) error {
	exists, err := publicationExists(ctx, sh.pool, sh.cfg.Publication)
	if err != nil || exists {
		return err
	}
	_, err = sh.pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{sh.cfg.Publication}.Sanitize()+` WITH (publish = 'insert', publish_via_partition_root = true)`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42710" || pgErr.Code == "23505") { // created meanwhile
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgcdc: create publication: %w", interpret(err))
	}
	return nil
}

// Remove takes table out of the stream: its events no longer hold the confirmed
// position back, it leaves the publication (when it still exists), and its record
// of the slot goes, so that adding it again publishes its unpublished rows. Stop
// its relay first.
func (sh *Shared) Remove(ctx context.Context, table outboxdriver.Table) error {
	table = table.WithDefaults()
	sh.mu.Lock()
	s := sh.byTable[table.String()]
	sh.mu.Unlock()
	if s == nil {
		return nil
	}
	sh.forget(s)
	var exists bool
	if err := sh.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.qTable).Scan(&exists); err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if !exists {
		return nil // dropped: gone from the publication with it
	}
	_, err := sh.pool.Exec(ctx, `ALTER PUBLICATION `+pgx.Identifier{sh.cfg.Publication}.Sanitize()+` DROP TABLE `+s.qTable)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42704" { // not in it, or no publication
		err = nil
	}
	if err != nil {
		return fmt.Errorf("pgcdc: publication %s: %w", sh.cfg.Publication, interpret(err))
	}
	if _, err := sh.pool.Exec(ctx, `DELETE FROM `+s.qCDC+` WHERE slot = $1`, sh.cfg.Slot); err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	return nil
}

// forget stops routing s's events, and lets its queued ones go.
func (sh *Shared) forget(s *Source) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.byTable[s.table.String()] == s {
		delete(sh.byTable, s.table.String())
	}
	if sh.byPrefix[s.table.MessagePrefix] == s {
		delete(sh.byPrefix, s.table.MessagePrefix)
	}
	if q := sh.queues[s]; q != nil {
		delete(sh.queues, s)
		q.drop()
	}
}

func (sh *Shared) sources() []*Source {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := make([]*Source, 0, len(sh.byTable))
	for _, s := range sh.byTable {
		out = append(out, s)
	}
	return out
}

// Init creates the publication and the slot when missing, for the tables added, so
// that their events are captured from now on, even before a relay first runs (see
// Source.Init).
func (sh *Shared) Init(ctx context.Context) error {
	if err := sh.checkWALLevel(ctx); err != nil {
		return err
	}
	si, err := slotInfoOf(ctx, sh.pool, sh.cfg.Slot)
	if err != nil || si.exists {
		return err
	}
	conn, err := sh.connect(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = createSlot(ctx, conn, sh.cfg.Slot, sh.cfg.Logger, sh.sources()...)
	return err
}

func (sh *Shared) checkWALLevel(ctx context.Context) error {
	unbounded, err := checkWALLevel(ctx, sh.pool)
	if unbounded && !sh.warned.Swap(true) {
		sh.log.Warn(unboundedWarning)
	}
	return err
}

func (sh *Shared) connect(ctx context.Context) (*pgconn.PgConn, error) {
	return connectReplication(ctx, cmp.Or(sh.cfg.Direct, sh.pool), sh.cfg.Timeout)
}

// Retire undoes Init when the tables leave CDC mode (see Source.Retire): it drops
// the slot, the publication and the added tables' records of the slot. It refuses
// while a process streams from the slot (ErrSlotActive). Running it again drops
// nothing.
func (sh *Shared) Retire(ctx context.Context) (Retired, error) {
	var r Retired
	si, err := slotInfoOf(ctx, sh.pool, sh.cfg.Slot)
	if err != nil {
		return r, fmt.Errorf("pgcdc: slot: %w", interpret(err))
	}
	if si.active {
		return r, fmt.Errorf("%w (slot %q)", ErrSlotActive, sh.cfg.Slot)
	}
	if si.exists {
		if err := dropSlot(ctx, sh.pool, sh.cfg.Slot); err != nil {
			return r, err
		}
		r.Slot = true
	}
	if r.Publication, err = publicationExists(ctx, sh.pool, sh.cfg.Publication); err != nil {
		return r, err
	}
	if _, err := sh.pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{sh.cfg.Publication}.Sanitize()); err != nil {
		return r, fmt.Errorf("pgcdc: drop publication: %w", interpret(err))
	}
	for _, s := range sh.sources() {
		if _, err := sh.pool.Exec(ctx, `DELETE FROM `+s.qCDC+` WHERE slot = $1`, sh.cfg.Slot); err != nil {
			return r, fmt.Errorf("pgcdc: %w", interpret(err))
		}
	}
	return r, nil
}

// Run streams every table's events until ctx ends. While another process streams
// from the slot it waits, trying again every Retry; a stream that fails is started
// again from the confirmed position. It returns only when ctx ends, or with
// ErrSlotLost or ErrWALLevel, which need an operator. Stop the tables' relays
// before ctx ends: they report their last acknowledged events first.
func (sh *Shared) Run(ctx context.Context) error {
	standby := false
	for {
		t, err := sh.startTerm(ctx)
		switch {
		case errors.Is(err, ErrSlotLost) || errors.Is(err, ErrWALLevel):
			return err
		case err != nil && ctx.Err() == nil:
			sh.log.Error("pgcdc: cannot stream the shared slot; trying again", "err", err, "retry_in", sh.cfg.Retry)
		case t == nil && !standby && ctx.Err() == nil:
			sh.log.Info("pgcdc: another process streams the shared slot; standing by")
			standby = true
		case t != nil:
			standby = false
			sh.follow(ctx, t)
			sh.endTerm(t)
			if t.rewind.Load() && ctx.Err() == nil {
				continue // at once: the tables wait for it
			}
			if err := t.alive(); ctx.Err() == nil {
				sh.log.Error("pgcdc: the shared stream ended; starting it again", "err", err)
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		tm := time.NewTimer(sh.cfg.Retry)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return nil
		}
	}
}

// registrations lists the CDC bookkeeping tables (<table>_cdc) of the database that
// record the slot, and reports whether any of them had streamed from it.
func (sh *Shared) registrations(ctx context.Context) (regs []string, streamed bool, err error) {
	rows, err := sh.pool.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE '%\_cdc'
  AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'backfilled_at' AND NOT a.attisdropped)
  AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'slot' AND NOT a.attisdropped)`)
	if err != nil {
		return nil, false, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, false, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	for _, name := range names {
		var done *bool
		err := sh.pool.QueryRow(ctx, `SELECT backfilled_at IS NOT NULL FROM `+name+` WHERE slot = $1`, sh.cfg.Slot).Scan(&done)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("pgcdc: %s: %w", name, interpret(err))
		}
		regs = append(regs, name)
		streamed = streamed || *done
	}
	return regs, streamed, nil
}

// progressEvery is how often each table's progress is recorded.
const progressEvery = time.Second

// follow waits for term t to end, or ends it when ctx does, recording the tables'
// progress meanwhile and once more at the end.
func (sh *Shared) follow(ctx context.Context, t *term) {
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	save := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := sh.saveProgress(sctx, t); err != nil {
			sh.log.Warn("pgcdc: could not record the tables' progress (a crash now sends more again)", "err", err)
		}
	}
	for {
		select {
		case <-tick.C:
			save()
		case <-t.done:
			sh.keepProgress(t)
			save()
			return
		case <-ctx.Done():
			save()
			t.cancel()
			<-t.done
			sh.keepProgress(t)
			return
		}
	}
}

// keepProgress carries each table's progress on term t over to the next term: what
// a stream read again skips.
func (sh *Shared) keepProgress(t *term) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.term != t {
		return
	}
	for s, q := range sh.queues {
		s.doneUpTo(q.ownDone())
	}
}

// startTerm takes the slot and starts streaming it (nil: another process streams
// from it).
func (sh *Shared) startTerm(ctx context.Context) (*term, error) {
	if err := sh.checkWALLevel(ctx); err != nil {
		return nil, err
	}
	if err := sh.ensurePublication(ctx); err != nil {
		return nil, err
	}
	tables := sh.sources()
	si, err := slotInfoOf(ctx, sh.pool, sh.cfg.Slot)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: slot: %w", interpret(err))
	}
	if si.active {
		return nil, nil
	}
	// The tables the slot served, added here or not yet: a slot that is gone must
	// be recognised as lost even before they are added, and a new slot must have
	// each of them publish the rows written before it (its backfill).
	var regs []string
	streamed := false
	if !si.exists || si.walStatus == "lost" {
		if regs, streamed, err = sh.registrations(ctx); err != nil {
			return nil, err
		}
	}
	if si.lost(streamed) && !sh.cfg.RecreateSlot {
		return nil, si.lostError(sh.cfg.Slot)
	}
	conn, err := sh.connect(ctx)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	if !si.exists || si.lost(streamed) {
		for _, reg := range regs {
			if _, err := sh.pool.Exec(ctx, `UPDATE `+reg+` SET backfill_until = NULL, backfilled_at = NULL, done_lsn = NULL WHERE slot = $1`, sh.cfg.Slot); err != nil {
				return nil, fmt.Errorf("pgcdc: %w", interpret(err))
			}
		}
	}
	if si, err = prepareSlot(ctx, conn, si, streamed, sh.cfg.Slot, sh.cfg.Logger, tables...); err != nil {
		return nil, err
	}
	l := newLedger(sh.cfg.MaxPending, sh.cfg.MaxPendingBytes, sh.cfg.MaxSpilled)
	l.reached = uint64(si.confirmed)
	var t *term
	route := func(ch *Change) (*queue, error) { return sh.route(t, ch) }
	t = newTerm(ctx, &stream{conn: conn, dec: NewSharedDecoder(func(prefix string) bool { return sh.accepts(t, prefix) }), l: l, route: route,
		statusEvery: sh.cfg.StatusInterval, silence: sh.cfg.Timeout, log: sh.log, bad: skipBad(&sh.skipped, sh.log),
		behind: func(first bool) { sh.behind(t, first) }})
	sh.mu.Lock()
	sh.term, sh.queues = t, map[*Source]*queue{}
	sh.mu.Unlock()
	if err := startReplication(ctx, conn, sh.cfg.Slot, sh.cfg.Publication); err != nil {
		sh.endTerm(t)
		if errors.Is(err, errSlotInUse) {
			return nil, nil
		}
		return nil, err
	}
	ok = true
	sh.terms.Add(1)
	go t.run()
	sh.log.Info("pgcdc: streaming the shared slot", "from", si.confirmed, "tables", len(tables))
	return t, nil
}

// Streaming reports whether this process streams the slot now: its tables' relays
// can lead (false: a standby, or between two attempts).
func (sh *Shared) Streaming() bool {
	sh.mu.Lock()
	t := sh.term
	sh.mu.Unlock()
	return t != nil && t.alive() == nil
}

// Terms is how many times this process started streaming the slot: each start
// after a cut, or after the stream met a table registered with the slot and not
// added yet (it stops there and starts again), is one more.
func (sh *Shared) Terms() int64 { return sh.terms.Load() }

// Skipped is how many WAL messages of the tables' prefixes could not be decoded
// into an event (each is logged with its position).
func (sh *Shared) Skipped() int64 { return sh.skipped.Load() }

func (sh *Shared) endTerm(t *term) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.term == t {
		sh.term, sh.queues = nil, nil
	}
}

// behind runs while reading the stream waits for room (first: it just started). It
// names the table holding the most of the room (its events held whole, and its
// spilled ones too once the spill is full), and parks it once it got none of its
// events done for ParkAfter: every other table's later events wait behind it
// otherwise.
func (sh *Shared) behind(t *term, first bool) {
	var most *Source
	var hog *queue
	n := 0
	spillFull := t.l.spillFull()
	sh.mu.Lock()
	if sh.term == t {
		for s, q := range sh.queues {
			if k := q.holding(spillFull); k > n && !q.isParked() {
				most, hog, n = s, q, k
			}
		}
	}
	sh.mu.Unlock()
	if most == nil {
		return
	}
	if first {
		sh.log.Warn("pgcdc: reading the shared stream waits for one table: it holds the most events not yet acknowledged, and every table's later events wait behind them (raise --max-pending, or see why its relay is slow or not leading)",
			"table", most.table.String(), "waiting", n)
	}
	if sh.cfg.ParkAfter < 0 {
		return
	}
	done := hog.ownDoneCount()
	if hog != t.hog || done != t.hogDone {
		t.hog, t.hogDone, t.hogSince = hog, done, time.Now() // a new hog, or it progressed
		return
	}
	if time.Since(t.hogSince) < sh.cfg.ParkAfter {
		return
	}
	sh.log.Warn("pgcdc: parking a table that holds the shared stream without progress: its later events are read again once its relay catches up; the slot's position waits for them meanwhile",
		"table", most.table.String(), "waiting", n, "for", sh.cfg.ParkAfter)
	t.l.hold()
	hog.park(func() {
		// Caught up: read the stream again from the slot's position, every
		// table skipping what it had done.
		if t.rewind.CompareAndSwap(false, true) {
			sh.log.Info("pgcdc: a parked table caught up; reading the shared stream again from the slot's position", "table", most.table.String())
			t.cancel()
		}
	})
}

// accepts reports whether a logical message's prefix is a table's here, or may be
// (Match, or a table registered with the slot): the decoder reads no other message.
func (sh *Shared) accepts(t *term, prefix string) bool {
	sh.mu.Lock()
	_, ok := sh.byPrefix[prefix]
	sh.mu.Unlock()
	if ok {
		return true
	}
	table, ok := tableOfPrefix(prefix)
	if !ok {
		return false
	}
	if sh.cfg.Match != nil && sh.cfg.Match(table) {
		return true
	}
	reg, err := sh.registered(t, table)
	return reg || err != nil // an error: route asks again, and ends the stream
}

// tableOfPrefix is the table a default message prefix (schema.name) names.
func tableOfPrefix(prefix string) (outboxdriver.Table, bool) {
	schema, name, ok := strings.Cut(prefix, ".")
	if !ok || schema == "" || name == "" {
		return outboxdriver.Table{}, false
	}
	return outboxdriver.Table{Schema: schema, Name: name}.WithDefaults(), true
}

// ErrTableNotAdded: the stream carries an event of a table registered with the slot
// (by Add or `outbox migrate --tables --cdc`) that was not added here. The stream
// does not read past it (it would be confirmed unsent); add the table, or take it
// out with Remove.
var ErrTableNotAdded = errors.New("an event of a table registered with the shared slot but not added here: add it, or take it out of the slot")

// route is the queue, on term t, of the table an event belongs to (nil: not a table
// of this slot). An event of a table that Match matches but was not added runs
// Rescan first, and one of a table registered with the slot but not added ends the
// stream (ErrTableNotAdded): the stream reads nothing on, so a table's events are
// never confirmed unread. Others (a table dropped or removed since, a message of
// another system) are skipped.
func (sh *Shared) route(t *term, ch *Change) (*queue, error) {
	key, table := ch.Prefix, outboxdriver.Table{Schema: ch.Schema, Name: ch.Table}
	if ch.Inserted {
		key = table.String()
	} else if tb, ok := tableOfPrefix(ch.Prefix); ok {
		table = tb
	} else {
		table = outboxdriver.Table{}
	}
	if q, known := sh.queueOf(t, key, ch); known {
		return q, nil
	}
	if table.Name == "" {
		return nil, nil // a prefix that names no table
	}
	sh.mu.Lock()
	at, declined := sh.declined[key]
	sh.mu.Unlock()
	if sh.cfg.Match != nil && sh.cfg.Match(table) && (!declined || time.Since(at) > declinedFor) {
		sh.log.Info("pgcdc: an event of a table not relayed yet; looking for new tables", "table", key)
		if sh.cfg.Rescan != nil {
			// On the reader's goroutine: bounded, so the stream's status updates are
			// late by at most half the server's patience.
			rctx, cancel := context.WithTimeout(t.ctx, sh.readerCallBound())
			err := sh.cfg.Rescan(rctx)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("pgcdc: rescan for table %s: %w", key, err)
			}
		}
		if q, known := sh.queueOf(t, key, ch); known {
			return q, nil
		}
		sh.mu.Lock()
		sh.declined[key] = time.Now()
		sh.mu.Unlock()
	}
	reg, err := sh.registered(t, table)
	switch {
	case err != nil:
		return nil, err
	case reg:
		return nil, fmt.Errorf("pgcdc: %w (table %s)", ErrTableNotAdded, table)
	}
	return nil, nil
}

// readerCallBound bounds a database call made on the stream's reading goroutine:
// half the server's patience with a silent client (Timeout, or the default
// wal_sender_timeout), so the stream's status updates are never held back past it.
func (sh *Shared) readerCallBound() time.Duration { return cmp.Or(sh.cfg.Timeout, silenceDefault) / 2 }

// registered reports whether table exists and is registered with the slot (asked
// once per table and stream).
func (sh *Shared) registered(t *term, table outboxdriver.Table) (bool, error) {
	table = table.WithDefaults()
	if reg, ok := t.registered[table.String()]; ok {
		return reg, nil
	}
	cdc := pgx.Identifier{table.Schema, table.Derived("_cdc")}.Sanitize()
	ctx, cancel := context.WithTimeout(t.ctx, sh.readerCallBound())
	defer cancel()
	var exists, reg bool
	if err := sh.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, cdc).Scan(&exists); err != nil {
		return false, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if exists {
		if err := sh.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+cdc+` WHERE slot = $1)`, sh.cfg.Slot).Scan(&reg); err != nil {
			return false, fmt.Errorf("pgcdc: %w", interpret(err))
		}
	}
	t.registered[table.String()] = reg
	return reg, nil
}

// queueOf is the queue on term t of the table named key (schema.name, or a message
// prefix), made on its first event; known says the table is one here. The queue
// is nil for an event the table had already done before this stream (at or before
// its done_lsn): read again from an older position, it is not sent again.
func (sh *Shared) queueOf(t *term, key string, ch *Change) (q *queue, known bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.byPrefix[key]
	if ch.Inserted {
		s = sh.byTable[key]
	}
	if s == nil || sh.term != t {
		return nil, false
	}
	if ch.CommitLSN != 0 && ch.CommitLSN <= s.doneLSN.Load() {
		return nil, true
	}
	q = sh.queues[s]
	if q == nil {
		q = newTableQueue(t.l)
		sh.queues[s] = q
	}
	if q.isParked() {
		return nil, true // read again once it caught up
	}
	return q, true
}

// doneUpTo records that every event of the table committed at or before lsn is
// done (it only moves forward).
func (s *Source) doneUpTo(lsn uint64) {
	for {
		old := s.doneLSN.Load()
		if old >= lsn || s.doneLSN.CompareAndSwap(old, lsn) {
			return
		}
	}
}

// loadDone reads how far the table's events were done by an earlier stream.
func (s *Source) loadDone(ctx context.Context) error {
	var done *string
	err := s.pool.QueryRow(ctx, `SELECT done_lsn::text FROM `+s.qCDC+` WHERE slot = $1`, s.cfg.Slot).Scan(&done)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && done == nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgcdc: %w (has `outbox migrate` run?)", interpret(err))
	}
	lsn, err := pglogrepl.ParseLSN(*done)
	if err != nil {
		return fmt.Errorf("pgcdc: done_lsn of %s: %w", s.table, err)
	}
	s.doneLSN.Store(uint64(lsn))
	return nil
}

// saveProgress records, for each table whose events got further since and ahead of
// the stream's confirmed position (which a stream read again starts from anyway),
// how far they are done (done_lsn), in one round trip.
func (sh *Shared) saveProgress(ctx context.Context, t *term) error {
	type step struct {
		s    *Source
		done uint64
	}
	var steps []step
	confirmed := t.l.confirmedLSN()
	sh.mu.Lock()
	if sh.term == t {
		for s, q := range sh.queues {
			if d := q.ownDone(); d > s.doneLSN.Load() && d > confirmed {
				steps = append(steps, step{s, d})
			}
		}
	}
	sh.mu.Unlock()
	if len(steps) == 0 {
		return nil
	}
	var b pgx.Batch
	for _, st := range steps {
		b.Queue(`UPDATE `+st.s.qCDC+` SET done_lsn = $1::pg_lsn WHERE slot = $2 AND (done_lsn IS NULL OR done_lsn < $1::pg_lsn)`,
			pglogrepl.LSN(st.done).String(), sh.cfg.Slot)
	}
	if err := sh.pool.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("pgcdc: recording the tables' progress: %w", interpret(err))
	}
	for _, st := range steps {
		st.s.doneUpTo(st.done)
	}
	return nil
}

// acquire is a shared Source's AcquireLeadership: while this process streams the
// slot, the table's relay lock, then a session on the stream's term; a standby
// otherwise.
func (sh *Shared) acquire(ctx context.Context, s *Source, params *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	sh.mu.Lock()
	t := sh.term
	sh.mu.Unlock()
	if t == nil || t.alive() != nil {
		return nil, nil
	}
	lead, err := s.inner.AcquireLeadership(ctx, params)
	if err != nil || lead == nil {
		return nil, err
	}
	sh.mu.Lock()
	q := sh.queues[s]
	if q == nil && sh.term == t && sh.byTable[s.table.String()] == s {
		q = newTableQueue(t.l)
		sh.queues[s] = q
	}
	sh.mu.Unlock()
	if q == nil {
		_ = lead.Release(context.WithoutCancel(ctx))
		return nil, nil // the term ended, or the table was removed, meanwhile
	}
	sess, err := s.newSession(ctx, lead, t, q)
	if err != nil {
		_ = lead.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	return sess, nil
}
