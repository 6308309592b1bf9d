package outboxsqlite_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// TestFindTables: patterns find the outbox tables `outbox migrate` made in the file,
// and no other table; the default schema stands for SQLite's only one, main.
func TestFindTables(t *testing.T) {
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "tables.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	ctx := context.Background()
	for _, name := range []string{"tenant_1", "tenant_2", "billing"} {
		m, err := outboxsqlite.New(db, &outboxsqlite.Options{Table: outboxdriver.Table{Name: name}}).Migrator()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE tenant_3 (id TEXT)`); err != nil { // not an outbox
		t.Fatal(err)
	}
	for _, tc := range []struct {
		patterns string
		want     []string
	}{
		{"tenant_*", []string{"main.tenant_1", "main.tenant_2"}},
		{"main.*", []string{"main.billing", "main.tenant_1", "main.tenant_2"}},
		{"billing,tenant_2", []string{"main.billing", "main.tenant_2"}},
		{"other.*", nil},
	} {
		ps, err := outboxdriver.ParseTablePatterns(tc.patterns)
		if err != nil {
			t.Fatal(err)
		}
		tables, err := outboxsqlite.FindTables(ctx, db, ps...)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, tb := range tables {
			got = append(got, tb.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.patterns, got, tc.want)
		}
	}
}
