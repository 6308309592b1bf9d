package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/simpg"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// simBackend is the database a run's processes share: one SQLite file (the real
// driver, each process with its own handle), or the PostgreSQL model (internal/simpg:
// the PostgreSQL store's statements over a model of the server, each process with its
// own connections).
type simBackend interface {
	// begin writes one transaction of the application through the real writer, and
	// returns what ends it (a commit, or with rollback a rollback).
	begin(ctx context.Context, evs []outbox.Event) (end func(rollback bool) error, err error)
	// admin is the application's store: status and dead letters, for the checks.
	admin() outboxdriver.Store
	// open is a new process's store, and sever, what its crash does to its
	// connections, close what its stop does.
	open(p *simProc) (store outboxdriver.Store, sever, close func())
	// lock is another session holding the oldest unpublished rows: it returns what
	// it locked, and its release.
	lock(ctx context.Context, live []*simProc, l simLock) (span string, release func())
	// dump writes the tables' rows to the run's story (a failed run).
	dump(w *simWorld)
	// reached are the database's own rare branches a run reached (coverage).
	reached() map[string]int
	close()
}

// sqliteBackend: one file, the real SQLite driver.
type sqliteBackend struct {
	path   string
	db     *sql.DB
	store  outboxdriver.Store
	writer *outbox.Writer[*sql.Tx]
}

func newSQLiteBackend(path string) (*sqliteBackend, error) {
	db, err := outboxsqlite.Open(path)
	if err != nil {
		return nil, err
	}
	app := outboxsqlite.New(db, &outboxsqlite.Options{LeaseTTL: simLeaseTTL})
	m, _ := app.Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		return nil, err
	}
	writer, err := outbox.NewWriter(outboxdriver.Driver[*sql.Tx](app), nil)
	if err != nil {
		return nil, err
	}
	store, _ := app.Store()
	return &sqliteBackend{path: path, db: db, store: store, writer: writer}, nil
}

func (b *sqliteBackend) begin(ctx context.Context, evs []outbox.Event) (func(bool) error, error) {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if err := b.writer.WriteTx(ctx, tx, evs...); err != nil {
		return nil, err
	}
	return func(rollback bool) error {
		if rollback {
			return tx.Rollback()
		}
		return tx.Commit()
	}, nil
}

func (b *sqliteBackend) admin() outboxdriver.Store { return b.store }

func (b *sqliteBackend) open(p *simProc) (outboxdriver.Store, func(), func()) {
	db, err := outboxsqlite.Open(b.path)
	if err != nil {
		panic(err)
	}
	clock := func() time.Time { return time.Now().Add(time.Duration(p.step.Load())) }
	store, _ := outboxsqlite.New(db, &outboxsqlite.Options{LeaseTTL: simLeaseTTL, Clock: clock}).Store()
	return store, nil, func() { _ = db.Close() }
}

// lock: the SQLite driver stands in for row locks with the claims its process has in
// flight, so the lock is a claim of the head rows on every live process's store.
func (b *sqliteBackend) lock(ctx context.Context, live []*simProc, l simLock) (string, func()) {
	var claims []outboxdriver.Claim
	span := ""
	for _, p := range live {
		c, err := p.store.Claim(ctx, &outboxdriver.ClaimParams{Limit: l.rows})
		if err != nil {
			continue
		}
		claims = append(claims, c)
		span = seqSpan(c.Rows())
	}
	return span, func() {
		for _, c := range claims {
			_ = c.Release(ctx) // a crashed process's store is closed: its locks went with it
		}
	}
}

func (b *sqliteBackend) dump(w *simWorld) {
	for _, q := range []string{"SELECT 'outbox', seq, id, coalesce(published_at,0), attempts, coalesce(last_error,'') FROM outbox", "SELECT 'dead', seq, id, dead_at, attempts, error FROM outbox_dead"} {
		rows, err := b.db.QueryContext(context.Background(), q)
		if err != nil {
			w.detail("%s: %v", q, err)
			continue
		}
		for rows.Next() {
			var tbl, id, e string
			var seq, at, attempts int64
			_ = rows.Scan(&tbl, &seq, &id, &at, &attempts, &e)
			w.detail("final %s seq=%d %s at=%d attempts=%d %.60s", tbl, seq, shortID(id), at, attempts, e)
		}
		_ = rows.Close()
	}
}

func (b *sqliteBackend) close() { _ = b.db.Close() }

func (b *sqliteBackend) reached() map[string]int { return nil }

// pgBackend: the PostgreSQL model. A process's crash ends its connections at once
// (its claims' transactions roll back, its leadership lock goes); a pause leaves them
// to the server's timeouts (the claim's HoldTimeout, the leadership's LeaderTimeout).
// A wall-clock step changes nothing here: PostgreSQL judges leases and retries by
// its own clock.
type pgBackend struct {
	db     *simpg.DB
	app    *simpg.Client
	table  outboxdriver.Table
	store  outboxdriver.Store
	writer *outbox.Writer[*simpg.Tx]
}

func newPGBackend() (*pgBackend, error) {
	b := &pgBackend{db: simpg.NewDB(), table: outboxdriver.Table{Name: "outbox"}}
	b.app = b.db.Client()
	drv := simpg.New(b.app, &b.table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		return nil, err
	}
	var err error
	if b.writer, err = outbox.NewWriter(outboxdriver.Driver[*simpg.Tx](drv), nil); err != nil {
		return nil, err
	}
	b.store, _ = drv.Store()
	return b, nil
}

func (b *pgBackend) begin(ctx context.Context, evs []outbox.Event) (func(bool) error, error) {
	tx, err := b.app.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.writer.WriteTx(ctx, tx, evs...); err != nil {
		return nil, err
	}
	return func(rollback bool) error {
		if rollback {
			return tx.Rollback(ctx)
		}
		return tx.Commit(ctx)
	}, nil
}

func (b *pgBackend) admin() outboxdriver.Store { return b.store }

func (b *pgBackend) open(*simProc) (outboxdriver.Store, func(), func()) {
	c := b.db.Client()
	store, _ := simpg.New(c, &b.table).Store()
	return store, c.Close, c.Close
}

// lock: a session of its own locks the oldest unpublished rows no one else locks
// (SELECT … FOR <strength> SKIP LOCKED, of the four strengths in turn, or an UPDATE
// left uncommitted): every strength conflicts with the claim's FOR UPDATE.
func (b *pgBackend) lock(ctx context.Context, _ []*simProc, l simLock) (string, func()) {
	c := b.db.Client()
	mode := simpg.LockMode(1 + int(l.at/time.Millisecond)%4)
	seqs, release, err := c.HoldOldest(ctx, b.table, l.rows, mode, mode == simpg.ForNoKeyUpdate)
	if err != nil || len(seqs) == 0 {
		c.Close()
		return "", func() {}
	}
	return fmt.Sprintf("%v (%v)", seqs, mode), func() { release(); c.Close() }
}

func (b *pgBackend) dump(w *simWorld) {
	for _, line := range b.db.Dump(b.table) {
		w.detail("final %s", line)
	}
}

func (b *pgBackend) close() { b.app.Close() }

// reached: what the model's server did, as "pg-" branches.
func (b *pgBackend) reached() map[string]int {
	out := map[string]int{"pg-run": 1}
	for k, v := range b.db.Counts() {
		out["pg-"+k] = v
	}
	return out
}
