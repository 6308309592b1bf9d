package outboxmysql

import (
	"context"
	"database/sql"
	"slices"

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
	exists := map[[2]string]bool{}
	var all [][2]string
	for rows.Next() {
		var st [2]string
		if err := rows.Scan(&st[0], &st[1]); err != nil {
			return nil, err
		}
		exists[st] = true
		all = append(all, st)
	}
	if err := rows.Err(); err != nil {
		return nil, interpretError(err)
	}
	var out []outboxdriver.Table
	for _, st := range all {
		t := outboxdriver.Table{Schema: st[0], Name: st[1]}.WithDefaults()
		if t.ValidatePortable() != nil || !exists[[2]string{st[0], st[1] + "_migrations"}] || !outboxdriver.MatchAny(patterns, t) {
			continue
		}
		out = append(out, t)
	}
	return out, nil
}
