package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
)

// mysqlDSN turns mysql://user:pass@host:3306/db?tls=true into the driver's DSN.
func mysqlDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || len(u.Path) < 2 {
		return "", usageErr("--db %s: want mysql://user@host:3306/database, with the password after the user and a colon", redact.URL(raw))
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, u.Path[1:]
	if u.Port() == "" {
		cfg.Addr += ":3306"
	}
	if u.Query().Get("tls") != "" {
		cfg.TLSConfig = u.Query().Get("tls")
	}
	return cfg.FormatDSN(), nil
}

func openMySQL(ctx context.Context, raw string, table outboxdriver.Table) (*database, error) {
	if table.Schema == outboxdriver.DefaultSchema {
		table.Schema = "" // the database of the URL
	}
	db, err := openMySQLDB(ctx, raw)
	if err != nil {
		return nil, err
	}
	drv := outboxmysql.New(db, &table)
	if err := drv.Err(); err != nil {
		_ = db.Close()
		return nil, usageErr("--table: %v", err)
	}
	store, _ := drv.Store()
	m, _ := drv.Migrator()
	return &database{store: store, migrator: m, close: func() { _ = db.Close() }, ping: db.PingContext}, nil
}

// openMySQLDB opens and pings the MySQL database at the mysql:// URL raw.
func openMySQLDB(ctx context.Context, raw string) (*sql.DB, error) {
	dsn, err := mysqlDSN(raw)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("cannot reach the database %s: %w", redact.URL(raw), err)
	}
	return db, nil
}
