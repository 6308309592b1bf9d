package outboxmysql

import (
	"context"
	"database/sql"
	"slices"

	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
)

// FindTables returns the outbox tables (those `outbox migrate` made: their
// <name>_migrations table beside them) in the databases db's user sees that match
// any of patterns, by database and name. A pattern's schema is a database; the
// default one (outboxdriver.DefaultSchema) stands for db's own.
func FindTables(ctx context.Context, db *sql.DB, patterns ...outboxdriver.TablePattern) ([]outboxdriver.Table, error) {
	var current string
	if err := db.QueryRowContext(ctx, "SELECT coalesce(DATABASE(), '')").Scan(&current); err != nil {
		return nil, interpretError(err)
	}
	patterns = slices.Clone(patterns)
	for i, p := range patterns {
		if p.Schema == outboxdriver.DefaultSchema {
			patterns[i].Schema = current
		}
	}
	rows, err := db.QueryContext(ctx, `SELECT table_schema, table_name FROM information_schema.tables
WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')
ORDER BY table_schema, table_name`)
	if err != nil {
		return nil, interpretError(err)
	}
	defer rows.Close()
	all, err := sqlrules.ScanTables(rows)
	if err != nil {
		return nil, interpretError(err)
	}
	// Its migrations table's name is never shortened (MySQL's limit is 64).
	return sqlrules.OutboxTables(all, func(t outboxdriver.Table) string { return t.Name + "_migrations" }, patterns), nil
}
