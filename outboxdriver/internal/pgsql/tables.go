package pgsql

import (
	"context"

	"github.com/outboxd/outbox/outboxdriver"
)

// listTables lists the database's tables (plain or partitioned, not partitions)
// outside the system schemas.
const listTables = `SELECT n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
ORDER BY n.nspname COLLATE "C", c.relname COLLATE "C"`

// FindTables returns the outbox tables that match any of patterns, in schema and
// name order. An outbox table is one `outbox migrate` made or adopted: its
// migrations table (Table.Derived("_migrations")) is beside it.
func FindTables(ctx context.Context, q Querier, patterns []outboxdriver.TablePattern) ([]outboxdriver.Table, error) {
	rows, err := q.Query(ctx, listTables)
	if err != nil {
		return nil, InterpretError(err)
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
		return nil, InterpretError(err)
	}
	var out []outboxdriver.Table
	for _, st := range all {
		t := outboxdriver.Table{Schema: st[0], Name: st[1]}.WithDefaults()
		if t.Validate() != nil || !exists[[2]string{t.Schema, t.Derived("_migrations")}] || !outboxdriver.MatchAny(patterns, t) {
			continue
		}
		out = append(out, t)
	}
	return out, nil
}
