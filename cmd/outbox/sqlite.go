package main

import (
	"context"
	"strings"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// sqlitePath turns sqlite://PATH into PATH (sqlite:///abs/file.db is absolute).
func sqlitePath(dsn string) string { return strings.TrimPrefix(dsn, "sqlite://") }

func openSQLite(_ context.Context, dsn string, table outboxdriver.Table, opts dbOptions) (*database, error) {
	path := sqlitePath(dsn)
	if path == "" {
		return nil, usageErr("--db sqlite://PATH: the path is empty")
	}
	if table.Schema == outboxdriver.DefaultSchema {
		table.Schema = "" // SQLite has no schemas; the default means "main"
	}
	db, err := outboxsqlite.Open(path)
	if err != nil {
		return nil, err
	}
	drv := outboxsqlite.New(db, &outboxsqlite.Options{Table: table, LeaseTTL: opts.leaseTTL})
	if err := drv.Err(); err != nil {
		_ = db.Close()
		return nil, usageErr("--table: %v", err)
	}
	store, err := drv.Store()
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	m, err := drv.Migrator()
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &database{store: store, migrator: m, close: func() { _ = db.Close() }, ping: db.PingContext, leaseTTL: drv.LeaseTTL()}, nil
}
