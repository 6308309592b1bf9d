package pgsql

import (
	"context"
	"errors"
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
//
// A table dropped meanwhile fails that statement; then each table is asked alone, so
// the others' answers still come: the error wraps ErrTableMissing and names the
// missing tables, and the indexes returned with it are the pending ones of the rest.
func PendingTables(ctx context.Context, q Querier, tables []outboxdriver.Table) ([]int, error) {
	if len(tables) == 0 {
		return nil, nil
	}
	probes := make([]string, len(tables))
	for i, t := range tables {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		probes[i] = fmt.Sprintf("SELECT %d WHERE EXISTS (SELECT 1 FROM %s WHERE published_at IS NULL)", i, pgx.Identifier{t.Schema, t.Name}.Sanitize())
	}
	out, err := queryIndexes(ctx, q, strings.Join(probes, "\nUNION ALL "))
	if err == nil || !errors.Is(err, outboxdriver.ErrTableMissing) || len(tables) == 1 {
		return out, err
	}
	out = out[:0]
	var missing []string
	for i, probe := range probes {
		got, err := queryIndexes(ctx, q, probe)
		switch {
		case errors.Is(err, outboxdriver.ErrTableMissing):
			missing = append(missing, tables[i].String())
		case err != nil:
			return nil, err
		default:
			out = append(out, got...)
		}
	}
	if len(missing) > 0 {
		return out, fmt.Errorf("%w: %s", outboxdriver.ErrTableMissing, strings.Join(missing, ", "))
	}
	return out, nil // created again between the two reads
}

// queryIndexes runs a statement that returns table indexes.
func queryIndexes(ctx context.Context, q Querier, sql string) ([]int, error) {
	rows, err := q.Query(ctx, sql)
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
