package outboxmysql

import (
	"context"
	"database/sql"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/sqlstore"
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
	// Its migrations table's name is never shortened (MySQL's limit is 64).
	tables, err := sqlstore.FindTables(ctx, db, `SELECT table_schema, table_name FROM information_schema.tables
WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')
ORDER BY table_schema, table_name`, current, func(t outboxdriver.Table) string { return t.Name + "_migrations" }, patterns)
	return tables, interpretError(err)
}
