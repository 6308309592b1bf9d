// Package outboxpgx is the outbox driver for PostgreSQL through pgx v5.
//
//	pool, _ := pgxpool.New(ctx, "postgres://...")
//	w, _ := outbox.NewWriter(outboxpgx.New(pool, nil), nil)
//	tx, _ := pool.Begin(ctx)
//	w.WriteTx(ctx, tx, event) // in the same transaction as the business change
//
// It is the only PostgreSQL driver that can LISTEN, so a relay built on it wakes up on
// the writer's notifications instead of waiting for its poll interval.
package outboxpgx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/pgsql"
)

// Driver binds outbox to a pgx pool. Build it with New.
type Driver struct {
	pool     *pgxpool.Pool
	sessions *pgxpool.Pool // WithSessions; nil: pool
	shared   *Shared       // WithShared: leadership and wake-ups on sessions shared by many tables
	table    outboxdriver.Table
	s        *pgsql.Statements
	err      error // a bad table name, reported by every method that needs it
}

// New returns a driver on pool (nil is allowed for a writer that only uses WriteTx).
// A nil table means outboxdriver's defaults (public.outbox, jsonb payload); an invalid
// table name is reported by the first call that needs it.
func New(pool *pgxpool.Pool, table *outboxdriver.Table) *Driver {
	var t outboxdriver.Table
	if table != nil {
		t = *table
	}
	s, err := pgsql.NewStatements(t)
	return &Driver{pool: pool, table: t.WithDefaults(), s: s, err: err}
}

var _ outboxdriver.Driver[pgx.Tx] = (*Driver)(nil)

// Name implements outboxdriver.Driver.
func (d *Driver) Name() string { return "pgx" }

// Table implements outboxdriver.Driver.
func (d *Driver) Table() outboxdriver.Table { return d.table }

// InterpretError translates a PostgreSQL error into the outboxdriver sentinels
// (ErrTableMissing, ErrDuplicateID), for code built on this driver (the CDC source):
// one place knows the SQLSTATE codes.
func InterpretError(err error) error { return pgsql.InterpretError(err) }

// Pool returns the pool the driver was built with.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// WithSessions returns a driver whose relay takes its leadership lock, listens for
// wake-ups and (CDC) replicates on sessions, a pool with direct connections to
// PostgreSQL, while claims and writes go through the driver's own pool: for a pool
// behind a transaction-pooling proxy (PgBouncer), where a session-level lock, LISTEN
// and replication cannot work (docs/operations.md).
func (d *Driver) WithSessions(sessions *pgxpool.Pool) *Driver {
	out := *d
	out.sessions = sessions
	return &out
}

// Sessions returns the pool of real sessions: WithSessions', or the driver's own
// (CDC sources build on it).
func (d *Driver) Sessions() *pgxpool.Pool {
	if d.sessions != nil {
		return d.sessions
	}
	return d.pool
}

// Err implements outboxdriver.Driver.
func (d *Driver) Err() error { return d.err }

// UnwrapExecutor implements outboxdriver.Driver.
func (d *Driver) UnwrapExecutor(tx pgx.Tx) outboxdriver.Executor {
	return pgsql.Executor{Statements: d.s, Querier: querier{tx}}
}

// GetExecutor implements outboxdriver.Driver.
func (d *Driver) GetExecutor() (outboxdriver.Executor, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	return pgsql.Executor{Statements: d.s, Querier: querier{d.pool}}, nil
}

// Store implements outboxdriver.Driver.
func (d *Driver) Store() (outboxdriver.Store, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	st := &pgsql.Store{Statements: d.s, DB: db{d.pool}, ListenFunc: d.listen}
	if d.sessions != nil {
		st.Sessions = db{d.sessions}
	}
	if d.shared != nil {
		st.Sessions = sharedDB{db{d.shared.pool}, d.shared}
		st.ListenFunc = d.shared.listenFunc(d.s.Channel())
	}
	return st, nil
}

// Migrator implements outboxdriver.Driver. Without a pool its SQL method still
// works, for `outbox migrate --print`.
func (d *Driver) Migrator() (outboxdriver.Migrator, error) {
	if d.err != nil {
		return nil, d.err
	}
	if d.pool == nil {
		return &pgsql.Migrator{Statements: d.s}, nil
	}
	return &pgsql.Migrator{Statements: d.s, DB: db{d.pool}}, nil
}

func (d *Driver) check() error {
	if d.err != nil {
		return d.err
	}
	if d.pool == nil {
		return outboxdriver.ErrNoPool
	}
	return nil
}

func (d *Driver) listen(ctx context.Context) (outboxdriver.Listener, error) {
	conn, err := d.Sessions().Acquire(ctx)
	if err != nil {
		return nil, pgsql.InterpretError(err)
	}
	if _, err := conn.Exec(ctx, d.s.ListenSQL()); err != nil {
		conn.Release()
		return nil, pgsql.InterpretError(err)
	}
	return &listener{conn: conn}, nil
}

type listener struct{ conn *pgxpool.Conn }

func (l *listener) Wait(ctx context.Context) error {
	_, err := l.conn.Conn().WaitForNotification(ctx)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("outbox listener: %w", err)
	}
	return err
}

func (l *listener) Close(context.Context) error {
	// The session still LISTENs; destroy it rather than return it to the pool.
	conn := l.conn.Hijack()
	return conn.Close(context.Background())
}

// pgxQuerier is what pgx.Tx, *pgxpool.Pool and *pgxpool.Conn share.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type querier struct{ q pgxQuerier }

func (q querier) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := q.q.Exec(ctx, sql, args...)
	return err
}

func (q querier) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	return q.q.Query(ctx, sql, args...)
}

type db struct{ pool *pgxpool.Pool }

func (d db) Exec(ctx context.Context, sql string, args ...any) error {
	return querier{d.pool}.Exec(ctx, sql, args...)
}

func (d db) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	return querier{d.pool}.Query(ctx, sql, args...)
}

func (d db) Begin(ctx context.Context) (pgsql.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return txAdapter{querier{tx}, tx}, nil
}

func (d db) Conn(ctx context.Context) (pgsql.Conn, error) {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{querier{c}, c}, nil
}

type txAdapter struct {
	querier
	tx pgx.Tx
}

func (t txAdapter) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t txAdapter) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

type conn struct {
	querier
	c *pgxpool.Conn
}

// Close destroys the session (so its advisory locks end with it) instead of
// returning it to the pool.
func (c *conn) Close() error {
	return c.c.Hijack().Close(context.Background())
}

// FindTables returns the outbox tables on pool (those `outbox migrate` made or
// adopted) that match any of patterns, in schema and name order: the tables of a
// schema-per-tenant database, say, with the pattern tenant_*.outbox.
func FindTables(ctx context.Context, pool *pgxpool.Pool, patterns ...outboxdriver.TablePattern) ([]outboxdriver.Table, error) {
	return pgsql.FindTables(ctx, db{pool}, patterns)
}

// FindTrustedTables is FindTables with the check of tables owned by others: a table
// is refused, with its reason, when it or a table named after it (its migrations, its
// dead letters...) is owned by a role not trusted, or carries a trigger, rule or
// row-level security policy. PostgreSQL runs those with the privileges of whoever
// touches the table, so the owner of a matched table could act as the relay or
// migrator. Trusted owners are the current role, the roles granted to it, and trust
// (docs/security.md, "Tables owned by others").
func FindTrustedTables(ctx context.Context, pool *pgxpool.Pool, trust []string, patterns ...outboxdriver.TablePattern) ([]outboxdriver.Table, []outboxdriver.RefusedTable, error) {
	tables, err := pgsql.FindTables(ctx, db{pool}, patterns)
	if err != nil {
		return nil, nil, err
	}
	return pgsql.TrustedTables(ctx, db{pool}, tables, trust)
}

// PendingTables returns those of tables that hold an unpublished row (due, or waiting
// for a retry), asked in one statement however many tables there are. A table
// dropped meanwhile does not hide the others' work: the error then wraps
// outboxdriver.ErrTableMissing and names it, and the tables returned with it are the
// pending ones of the rest.
func PendingTables(ctx context.Context, pool *pgxpool.Pool, tables ...outboxdriver.Table) ([]outboxdriver.Table, error) {
	idx, err := pgsql.PendingTables(ctx, db{pool}, tables)
	out := make([]outboxdriver.Table, len(idx))
	for i, k := range idx {
		out[i] = tables[k]
	}
	return out, err
}
