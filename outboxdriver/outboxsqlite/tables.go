package outboxsqlite

import (
	"context"
	"database/sql"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/sqlstore"
)

// FindTables returns the outbox tables of db (those `outbox migrate` made: their
// <name>_migrations table beside them) that match any of patterns, by name. SQLite
// has no schemas: every table is in "main", which a pattern's default schema
// (outboxdriver.DefaultSchema) stands for.
func FindTables(ctx context.Context, db *sql.DB, patterns ...outboxdriver.TablePattern) ([]outboxdriver.Table, error) {
	tables, err := sqlstore.FindTables(ctx, db, `SELECT 'main', name FROM sqlite_schema WHERE type = 'table' ORDER BY name`, "main",
		func(t outboxdriver.Table) string { return t.Derived("_migrations") }, patterns)
	return tables, interpretError(err)
}
