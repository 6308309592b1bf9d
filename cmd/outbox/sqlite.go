package main

import (
	"context"

	"github.com/outboxd/outbox/outboxdriver"
)

func openSQLite(ctx context.Context, dsn string, table outboxdriver.Table) (*database, error) {
	return nil, usageErr("--db sqlite://: the SQLite driver is not built yet")
}
