package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/replay"
)

// database is an opened --db.
type database struct {
	store    outboxdriver.Store
	migrator outboxdriver.Migrator
	close    func()
	ping     func(context.Context) error // the database answers (the relay's /readyz)
	leaseTTL time.Duration               // 0 when leadership is not a lease (PostgreSQL's ends with the session)
	// cdc opens the CDC source of the table (PostgreSQL only; nil elsewhere).
	cdc func(*pgcdc.Config) (*pgcdc.Source, error)
	// replayer reads the table's published history for `outbox replay` runs
	// (PostgreSQL only; nil elsewhere).
	replayer func() *replay.Replayer
	// columns describes the table's columns, for the Debezium router (PostgreSQL
	// only; nil elsewhere).
	columns func(ctx context.Context) ([]debezium.Column, error)
}

// dbOptions are driver settings from flags.
type dbOptions struct {
	leaseTTL time.Duration // SQLite relay lease
	// relay: the relay opens it, which needs real sessions (leadership lock,
	// LISTEN, replication): a transaction-pooling proxy in front of --db is refused
	// unless leaderDSN, a direct URL, takes those.
	relay     bool
	leaderDSN string
}

func parseTable(name string, payload string) (outboxdriver.Table, error) {
	// An empty name or part ('', '.', 'public.', an unset shell variable) would
	// quietly mean the default table: say so instead.
	for _, part := range strings.Split(name, ".") {
		if part == "" {
			return outboxdriver.Table{}, usageErr("--table %q: empty table or schema name (want [schema.]name)", name)
		}
	}
	t, err := outboxdriver.ParseTable(name)
	if err != nil {
		return t, usageErr("--table: %v", err)
	}
	t.Payload = outboxdriver.PayloadType(payload)
	if err := t.Validate(); err != nil {
		return t, usageErr("--payload-type: %v", err)
	}
	return t, nil
}

// dbFlagHelp is every command's --db help: the one list of the databases.
const dbFlagHelp = "database URL: postgres://user@host:5432/db, mysql://user@host:3306/db or sqlite://PATH"

// dbTableFlags declares --db (with its help, which says the databases the command
// takes) and --table, the same in every command that opens the outbox table.
func dbTableFlags(fs *flag.FlagSet, dbHelp string) (dsn, table *string) {
	return fs.String("db", "", dbHelp),
		fs.String("table", outboxdriver.DefaultSchema+"."+outboxdriver.DefaultTable, "outbox table, [schema.]name")
}

// openDB connects to dsn and checks the database answers.
func openDB(ctx context.Context, dsn string, table outboxdriver.Table, opts dbOptions) (*database, error) {
	scheme, _, ok := strings.Cut(dsn, "://")
	if dsn == "" {
		return nil, usageErr("--db is required (postgres://..., mysql://..., sqlite://PATH)")
	}
	if !ok {
		return nil, usageErr("--db %q: want a URL such as postgres://user@host:5432/db, mysql://user@host:3306/db or sqlite://PATH", redact.URL(dsn))
	}
	switch scheme {
	case "postgres", "postgresql":
		return openPostgres(ctx, dsn, table, opts)
	case "sqlite":
		return openSQLite(ctx, dsn, table, opts)
	case "mysql":
		return openMySQL(ctx, dsn, table)
	}
	return nil, usageErr("--db %q: unknown scheme %q (want postgres://, mysql://, sqlite://)", redact.URL(dsn), scheme)
}

func openPostgres(ctx context.Context, dsn string, table outboxdriver.Table, opts dbOptions) (*database, error) {
	if opts.leaderDSN != "" && !strings.HasPrefix(opts.leaderDSN, "postgres://") && !strings.HasPrefix(opts.leaderDSN, "postgresql://") {
		return nil, usageErr("--leader-db %s: want a postgres:// URL", redact.URL(opts.leaderDSN))
	}
	// Behind a transaction pooler (--leader-db given), statements are not prepared
	// by name: a pooled server connection may not have them (PgBouncer before 1.21).
	pool, err := openPool(ctx, "--db", dsn, opts.leaderDSN != "")
	if err != nil {
		return nil, err
	}
	drv := outboxpgx.New(pool, &table)
	closeAll := pool.Close
	if opts.relay {
		if pooled, err := transactionPooled(ctx, pool); err != nil {
			pool.Close()
			return nil, fmt.Errorf("database %s: %w", redact.URL(dsn), err)
		} else if pooled && opts.leaderDSN == "" {
			pool.Close()
			return nil, usageErr("--db %s goes through a transaction-pooling proxy (PgBouncer's pool_mode = transaction): the relay's leadership lock, LISTEN and CDC need a session of their own; give --leader-db a direct URL to PostgreSQL, or use session pooling (docs/operations.md)", redact.URL(dsn))
		}
	}
	if opts.leaderDSN != "" {
		sessions, err := openPool(ctx, "--leader-db", opts.leaderDSN, false)
		if err != nil {
			pool.Close()
			return nil, err
		}
		if pooled, err := transactionPooled(ctx, sessions); err != nil || pooled {
			pool.Close()
			sessions.Close()
			if err != nil {
				return nil, fmt.Errorf("database %s: %w", redact.URL(opts.leaderDSN), err)
			}
			return nil, usageErr("--leader-db %s goes through a transaction-pooling proxy too: give it a direct URL to PostgreSQL", redact.URL(opts.leaderDSN))
		}
		drv = drv.WithSessions(sessions)
		closeAll = func() { pool.Close(); sessions.Close() }
	}
	store, err := drv.Store()
	if err != nil {
		closeAll()
		return nil, err
	}
	m, err := drv.Migrator()
	if err != nil {
		closeAll()
		return nil, err
	}
	return &database{store: store, migrator: m, close: closeAll, ping: pool.Ping,
		cdc:     func(cfg *pgcdc.Config) (*pgcdc.Source, error) { return pgcdc.ForDriver(drv, cfg) },
		columns: func(ctx context.Context) ([]debezium.Column, error) { return pgColumns(ctx, pool, drv.Table()) },
		// its lock is a session's: the direct pool when --leader-db gives one
		replayer: func() *replay.Replayer { return replay.New(drv.Sessions(), drv.Table()) },
	}, nil
}

// openPool opens and pings a pool on dsn (flag names it in errors).
func openPool(ctx context.Context, flag, dsn string, unnamedStatements bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse error quotes pieces of the URL, password included: not shown.
		return nil, usageErr("%s %s: not a valid PostgreSQL URL (characters such as / ? # @ in the password must be percent-encoded)", flag, redact.URL(dsn))
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "outbox" // named in pg_stat_activity and `outbox status`
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// leadership + listener + up to three batches in flight, with room to spare
		cfg.MaxConns = 8
	}
	cfg.ConnConfig.DialFunc = pgDial
	if unnamedStatements && !strings.Contains(dsn, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", redact.URL(dsn), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach the database %s: %w", redact.URL(dsn), err)
	}
	return pool, nil
}

// transactionPooled reports whether pool's connections go through a proxy that
// hands a server session to a client per transaction (PgBouncer's pool_mode =
// transaction): a setting one connection makes for its session is then lost to it,
// or seen by another connection. Its statements run in the simple protocol, which any
// pooler passes.
func transactionPooled(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer b.Release()
	const set, get = "SELECT set_config('outbox.pooler_probe', $1, false)", "SELECT coalesce(current_setting('outbox.pooler_probe', true), '')"
	token := rand.Text()
	simple := pgx.QueryExecModeSimpleProtocol
	if _, err := a.Exec(ctx, set, simple, token); err != nil {
		return false, err
	}
	var again, other string
	if err := a.QueryRow(ctx, get, simple).Scan(&again); err != nil {
		return false, err
	}
	if err := b.QueryRow(ctx, get, simple).Scan(&other); err != nil {
		return false, err
	}
	for _, c := range []*pgxpool.Conn{a, b} {
		_, _ = c.Exec(ctx, set, simple, "")
	}
	return again != token || other == token, nil
}

// pgColumns describes a table's columns as the Debezium router needs them.
func pgColumns(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table) ([]debezium.Column, error) {
	rows, err := pool.Query(ctx, `SELECT attname, format_type(atttypid, NULL), attnotnull FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, pgx.Identifier{t.Schema, t.Name}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", t, err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (debezium.Column, error) {
		var c debezium.Column
		return c, r.Scan(&c.Name, &c.Type, &c.NotNull)
	})
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", t, err)
	}
	return cols, nil
}

// openTable opens --db for the --table of a command that reads or manages an existing
// outbox (status, dlq, cleanup).
func openTable(ctx context.Context, dsn, tableName string) (*database, outboxdriver.Table, error) {
	table, err := parseTable(tableName, string(outboxdriver.PayloadJSON))
	if err != nil {
		return nil, table, err
	}
	db, err := openDB(ctx, dsn, table, dbOptions{})
	return db, table, err
}
