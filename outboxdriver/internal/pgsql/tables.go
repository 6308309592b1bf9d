package pgsql

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

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
	all, err := outboxdriver.ScanTables(rows)
	if err != nil {
		return nil, InterpretError(err)
	}
	return outboxdriver.OutboxTables(all, func(t outboxdriver.Table) string { return t.Derived("_migrations") }, patterns), nil
}

// PendingTables returns the indexes of tables that hold an unpublished row (due or
// waiting for a retry), in one statement however many tables: a relay of many
// tables asks it every second or so instead of polling each table.
func PendingTables(ctx context.Context, q Querier, tables []outboxdriver.Table) ([]int, error) {
	if len(tables) == 0 {
		return nil, nil
	}
	var b strings.Builder
	for i, t := range tables {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteString("\nUNION ALL ")
		}
		fmt.Fprintf(&b, "SELECT %d WHERE EXISTS (SELECT 1 FROM %s WHERE published_at IS NULL)", i, pgx.Identifier{t.Schema, t.Name}.Sanitize())
	}
	rows, err := q.Query(ctx, b.String())
	if err != nil {
		return nil, InterpretError(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, err
		}
		out = append(out, i)
	}
	return out, InterpretError(rows.Err())
}
