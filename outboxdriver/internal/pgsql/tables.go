package pgsql

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox/internal/sqlrules"
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
	all, err := sqlrules.ScanTables(rows)
	if err != nil {
		return nil, InterpretError(err)
	}
	return sqlrules.OutboxTables(all, func(t outboxdriver.Table) string { return t.Derived("_migrations") }, patterns), nil
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

// trustQuery reads, for the tables of each outbox ($1, $2: schemas and names; the
// table and those named after it: its migrations, dead letters, archive,
// partitions...), who owns each, whether that owner is trusted (the current role, a
// role it was granted, or one named in $3), and the triggers, rules and row-level
// security policies on it. PostgreSQL runs those with the privileges of whoever
// touches the table, and outbox creates none. One statement for every table: a relay
// of a thousand tenants asks it at every rescan.
const trustQuery = `WITH RECURSIVE mine(oid) AS (
  SELECT oid FROM pg_roles WHERE rolname = current_user
  UNION SELECT m.roleid FROM pg_auth_members m JOIN mine ON m.member = mine.oid
)
SELECT t.i, c.relname, pg_get_userbyid(c.relowner),
  c.relowner IN (SELECT oid FROM mine) OR pg_get_userbyid(c.relowner) = ANY($3::text[]),
  coalesce((SELECT string_agg(quote_ident(tgname), ', ' ORDER BY tgname) FROM pg_trigger WHERE tgrelid = c.oid AND NOT tgisinternal), ''),
  coalesce((SELECT string_agg(quote_ident(rulename), ', ' ORDER BY rulename) FROM pg_rewrite WHERE ev_class = c.oid AND rulename <> '_RETURN'), ''),
  coalesce((SELECT string_agg(quote_ident(polname), ', ' ORDER BY polname) FROM pg_policy WHERE polrelid = c.oid), '')
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(schema, name, i)
JOIN pg_namespace n ON n.nspname = t.schema
JOIN pg_class c ON c.relnamespace = n.oid AND c.relkind IN ('r', 'p')
  AND (c.relname = t.name OR starts_with(c.relname, t.name || '_'))
ORDER BY t.i, c.relname COLLATE "C"`

// TrustedTables splits tables into those safe to act on and those refused, each with
// its reason: a table (or one named after it) owned by a role not trusted, or carrying
// a trigger, rule or policy, which would run its owner's code with the privileges of
// the relay or migrator touching it. Trusted owners are the current role, the roles it
// was granted (not a superuser's implicit membership of every role), and trust.
func TrustedTables(ctx context.Context, q Querier, tables []outboxdriver.Table, trust []string) ([]outboxdriver.Table, []outboxdriver.RefusedTable, error) {
	if len(tables) == 0 {
		return nil, nil, nil
	}
	if trust == nil {
		trust = []string{}
	}
	schemas, names := make([]string, len(tables)), make([]string, len(tables))
	for i, t := range tables {
		schemas[i], names[i] = t.Schema, t.Name
	}
	rows, err := q.Query(ctx, trustQuery, schemas, names, trust)
	if err != nil {
		return nil, nil, InterpretError(err)
	}
	defer rows.Close()
	owners, code := make([][]string, len(tables)), make([][]string, len(tables))
	for rows.Next() {
		var (
			i                                      int64
			name, owner, triggers, rules, policies string
			trusted                                bool
		)
		if err := rows.Scan(&i, &name, &owner, &trusted, &triggers, &rules, &policies); err != nil {
			return nil, nil, err
		}
		i-- // ORDINALITY counts from 1
		if !trusted && !slices.Contains(owners[i], owner) {
			owners[i] = append(owners[i], owner)
		}
		for _, c := range []struct{ what, names string }{{"trigger", triggers}, {"rule", rules}, {"row-level security policy", policies}} {
			if c.names != "" {
				code[i] = append(code[i], fmt.Sprintf("%s %s on %s", c.what, c.names, name))
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, InterpretError(err)
	}
	var ok []outboxdriver.Table
	var refused []outboxdriver.RefusedTable
	for i, t := range tables {
		var reasons []string
		if len(owners[i]) > 0 {
			reasons = append(reasons, fmt.Sprintf("owned by role %s, which is not trusted (trusted: the current role, the roles granted to it, --trust-owner)",
				strings.Join(owners[i], ", ")))
		}
		if len(code[i]) > 0 {
			reasons = append(reasons, "it has code outbox did not create, which would run as whoever touches the table: "+strings.Join(code[i], ", "))
		}
		if len(reasons) > 0 {
			refused = append(refused, outboxdriver.RefusedTable{Table: t, Reason: strings.Join(reasons, "; ")})
			continue
		}
		ok = append(ok, t)
	}
	return ok, refused, nil
}
