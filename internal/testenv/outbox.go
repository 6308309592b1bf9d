package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// Outbox returns a pool on the test database and a pgx driver on a migrated outbox
// table in a schema of the test's own.
func Outbox(t testing.TB) (*pgxpool.Pool, *outboxpgx.Driver) {
	t.Helper()
	url := DatabaseURL(t)
	pool := Pool(t, url)
	table := outboxdriver.Table{Schema: Schema(t, url)}
	drv := outboxpgx.New(pool, &table)
	m, err := drv.Migrator()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool, drv
}
