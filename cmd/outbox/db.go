package main

import (
	"context"
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
)

// database is an opened --db.
type database struct {
	store    outboxdriver.Store
	migrator outboxdriver.Migrator
	close    func()
	leaseTTL time.Duration // 0 when leadership is not a lease (PostgreSQL's ends with the session)
	// cdc opens the CDC source of the table (PostgreSQL only; nil elsewhere).
	cdc func(*pgcdc.Config) (*pgcdc.Source, error)
	// columns describes the table's columns, for the Debezium router (PostgreSQL
	// only; nil elsewhere).
	columns func(ctx context.Context) ([]debezium.Column, error)
}

// dbOptions are driver settings from flags.
type dbOptions struct {
	leaseTTL time.Duration // SQLite relay lease
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
		return openPostgres(ctx, dsn, table)
	case "sqlite":
		return openSQLite(ctx, dsn, table, opts)
	case "mysql":
		return openMySQL(ctx, dsn, table)
	}
	return nil, usageErr("--db %q: unknown scheme %q (want postgres://, mysql://, sqlite://)", redact.URL(dsn), scheme)
}

func openPostgres(ctx context.Context, dsn string, table outboxdriver.Table) (*database, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse error quotes pieces of the URL, password included: not shown.
		return nil, usageErr("--db %s: not a valid PostgreSQL URL (characters such as / ? # @ in the password must be percent-encoded)", redact.URL(dsn))
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "outbox" // named in pg_stat_activity and `outbox status`
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// leadership + listener + up to three batches in flight, with room to spare
		cfg.MaxConns = 8
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
	drv := outboxpgx.New(pool, &table)
	store, err := drv.Store()
	if err != nil {
		pool.Close()
		return nil, err
	}
	m, err := drv.Migrator()
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &database{store: store, migrator: m, close: pool.Close,
		cdc:     func(cfg *pgcdc.Config) (*pgcdc.Source, error) { return pgcdc.ForDriver(drv, cfg) },
		columns: func(ctx context.Context) ([]debezium.Column, error) { return pgColumns(ctx, pool, drv.Table()) },
	}, nil
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
