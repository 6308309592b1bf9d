package outboxsqlite

import (
	"context"
	"database/sql"
	"slices"

	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
)

// FindTables returns the outbox tables of db (those `outbox migrate` made: their
// <name>_migrations table beside them) that match any of patterns, by name. SQLite
// has no schemas: every table is in "main", which a pattern's default schema
// (outboxdriver.DefaultSchema) stands for.
func FindTables(ctx context.Context, db *sql.DB, patterns ...outboxdriver.TablePattern) ([]outboxdriver.Table, error) {
	patterns = slices.Clone(patterns)
	for i, p := range patterns {
		if p.Schema == outboxdriver.DefaultSchema {
			patterns[i].Schema = "main"
		}
	}
	rows, err := db.QueryContext(ctx, `SELECT 'main', name FROM sqlite_schema WHERE type = 'table' ORDER BY name`)
	if err != nil {
		return nil, interpretError(err)
	}
	defer func() { _ = rows.Close() }()
	all, err := sqlrules.ScanTables(rows)
	if err != nil {
		return nil, interpretError(err)
	}
	return sqlrules.OutboxTables(all, func(t outboxdriver.Table) string { return t.Derived("_migrations") }, patterns), nil
}
