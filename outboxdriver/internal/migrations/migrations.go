// Package migrations loads a driver's numbered, embedded SQL migrations and renders
// them for one table. Every driver's migrator uses it, so the naming rules and the
// printed script are the same for all databases.
package migrations

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/outboxd/outbox/outboxdriver"
)

// Migration is one numbered schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Load renders every migrations/NNN_name.sql file of fsys with data (identifiers
// already validated and quoted by the driver), in version order.
func Load(fsys fs.FS, data map[string]string) ([]Migration, error) {
	entries, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		base := strings.TrimPrefix(e, "migrations/")
		num, name, ok := strings.Cut(strings.TrimSuffix(base, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %q is not named NNN_name.sql", base)
		}
		raw, err := fs.ReadFile(fsys, e)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(base).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", base, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("migration %s: %w", base, err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: buf.String()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Script is every migration as one SQL script with its bookkeeping, for teams that
// run their own migration tool. createVersions creates the version table;
// recordVersion is an INSERT with one %d for the version.
func Script(title string, ms []Migration, createVersions, recordVersion string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- %s\nBEGIN;\n%s;\n", title, createVersions)
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- migration %03d_%s\n%s\n"+recordVersion+";\n", m.Version, m.Name, strings.TrimSpace(m.SQL), m.Version)
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}

// Known are the versions of ms.
func Known(ms []Migration) []int {
	out := make([]int, len(ms))
	for i, m := range ms {
		out[i] = m.Version
	}
	return out
}

// Rows is the part of a result set Versions reads (database/sql's and pgx's both fit).
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Versions reads the applied versions from a `SELECT version` result; the caller
// closes rows. A list read halfway is an error: it would re-run applied migrations.
func Versions(rows Rows) (map[int]bool, error) {
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}

// Apply runs, in version order, every migration not in done: run applies one, record
// notes its version. It is the one migration loop of every driver; each driver
// supplies its own session, lock and transaction (they differ: PostgreSQL runs all in
// one transaction under an advisory lock, SQLite in one immediate transaction, MySQL
// statement by statement under GET_LOCK because DDL commits).
func Apply(ms []Migration, done map[int]bool, run func(Migration) error, record func(version int) error) ([]int, error) {
	var applied []int
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if err := run(m); err != nil {
			return applied, fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if err := record(m.Version); err != nil {
			return applied, fmt.Errorf("migration %03d_%s: record the version: %w", m.Version, m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// Schema reads, for a database/sql driver (MySQL, SQLite), the versions recorded in
// versionTable against ms: a missing version table (interpret makes it
// ErrTableMissing) means a table no migration made.
func Schema(ctx context.Context, db *sql.DB, versionTable string, ms []Migration, interpret func(error) error) (*outboxdriver.SchemaState, error) {
	rows, err := db.QueryContext(ctx, "SELECT version FROM "+versionTable)
	if err != nil {
		if err = interpret(err); errors.Is(err, outboxdriver.ErrTableMissing) {
			return outboxdriver.NewSchemaState(Known(ms), nil), nil
		}
		return nil, err
	}
	done, err := Versions(rows)
	_ = rows.Close()
	if err != nil {
		return nil, err
	}
	return outboxdriver.NewSchemaState(Known(ms), done), nil
}

// Set is a table's migrations on a database/sql database and the table that records
// those applied (MySQL/MariaDB, SQLite): the schema's SQL and its state read back.
// Applying them is the driver's own (each locks its own way).
type Set struct {
	DB *sql.DB // nil: a writer-only driver, which cannot read the state
	// Title heads the SQL script.
	Title string
	// Versions is the quoted table of the versions applied; Create creates it and
	// Record inserts one version into it (%d) in the script.
	Versions, Create, Record string
	// Load reads the migrations, bound to the table's names.
	Load func() ([]Migration, error)
	// Interpret translates the database's errors to outboxdriver's sentinels.
	Interpret func(error) error
}

// SQL implements outboxdriver.Migrator.
func (s Set) SQL() (string, error) {
	ms, err := s.Load()
	if err != nil {
		return "", err
	}
	return Script(s.Title, ms, s.Create, s.Record), nil
}

// Schema implements outboxdriver.Migrator.
func (s Set) Schema(ctx context.Context) (*outboxdriver.SchemaState, error) {
	if s.DB == nil {
		return nil, outboxdriver.ErrNoPool
	}
	ms, err := s.Load()
	if err != nil {
		return nil, err
	}
	return Schema(ctx, s.DB, s.Versions, ms, s.Interpret)
}
