// Package sqlrules holds the SQL and the scanning every table store shares: the
// claim's ordering rules as SQL text, the skip of aggregates in flight, the reading of
// a settling transaction's rows and of a database's outbox tables. It is internal:
// the seam drivers implement is package outboxdriver; these are their parts.
package sqlrules

import (
	"strings"

	"github.com/outboxd/outbox/outboxdriver"
)

// The claim's ordering rules, as SQL every driver (and the CDC backfill) puts in its
// claim, so each rule is written once. They read the outbox row under the alias o;
// table and dead are the quoted outbox and dead-letter tables. The text is the same
// in PostgreSQL, MySQL/MariaDB and SQLite.

// NotBehindFailingSQL: the row is not behind an earlier unpublished row of its
// aggregate that failed (attempts > 0): a failing event is retried alone, and its
// aggregate's later events follow only after it succeeds or dies.
func NotBehindFailingSQL(table string) string {
	return `NOT EXISTS (SELECT 1 FROM ` + table + ` AS f WHERE f.published_at IS NULL AND f.attempts > 0
                  AND f.aggregatetype = o.aggregatetype AND f.aggregateid = o.aggregateid AND f.seq < o.seq)`
}

// NotHeldSQL: the row's aggregate is not held by a dead letter (quarantined until the
// dead letter is replayed or purged).
func NotHeldSQL(dead string) string {
	return `NOT EXISTS (SELECT 1 FROM ` + dead + ` AS d WHERE d.holds_key
                  AND d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid)`
}

// DeadLetterColumns are the dead-letter columns a move to the dead letters fills, in
// the order the PostgreSQL statements (the polling store's and the CDC source's)
// list them; dead_at takes its default.
const DeadLetterColumns = "id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, seq, created_at, attempts, error, holds_key"

// SkipSQL is the claim's condition for ClaimParams.Skip on a driver with "?"
// placeholders: the row's aggregate is none of n aggregates, given as 2n parameters
// (SkipArgs).
func SkipSQL(n int) string {
	return "(o.aggregatetype, o.aggregateid) NOT IN (" + strings.Repeat("(?, ?), ", n-1) + "(?, ?))"
}

// SkipArgs are SkipSQL's parameters.
func SkipArgs(skip []outboxdriver.Aggregate) []any {
	args := make([]any, 0, 2*len(skip))
	for _, a := range skip {
		args = append(args, a.Type, a.ID)
	}
	return args
}

// ScanAttempts reads a settling transaction's locked rows, (id, attempts) each, into
// the map Restrict takes.
func ScanAttempts(next func() bool, scan func(dest ...any) error, rowsErr func() error) (map[string]int, error) {
	current := map[string]int{}
	for next() {
		var (
			id       string
			attempts int
		)
		if err := scan(&id, &attempts); err != nil {
			return nil, err
		}
		current[id] = attempts
	}
	return current, rowsErr()
}

// TableRows is what a driver's query of (schema, name) rows gives.
type TableRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanTables reads rows of (schema, name).
func ScanTables(rows TableRows) ([]outboxdriver.Table, error) {
	var all []outboxdriver.Table
	for rows.Next() {
		var t outboxdriver.Table
		if err := rows.Scan(&t.Schema, &t.Name); err != nil {
			return nil, err
		}
		all = append(all, t)
	}
	return all, rows.Err()
}

// OutboxTables picks, of a database's tables, the outbox tables that match any of
// patterns, in the order given: those whose migrations table (named by migrations)
// is among them, and whose names are valid here.
func OutboxTables(all []outboxdriver.Table, migrations func(outboxdriver.Table) string, patterns []outboxdriver.TablePattern) []outboxdriver.Table {
	exists := map[outboxdriver.Table]bool{}
	for _, t := range all {
		exists[outboxdriver.Table{Schema: t.Schema, Name: t.Name}] = true
	}
	var out []outboxdriver.Table
	for _, t := range all {
		t = t.WithDefaults()
		if t.Validate() != nil || !exists[outboxdriver.Table{Schema: t.Schema, Name: migrations(t)}] || !outboxdriver.MatchAny(patterns, t) {
			continue
		}
		out = append(out, t)
	}
	return out
}
