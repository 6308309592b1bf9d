package outboxpgx_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// TestFindTables: patterns find the outbox tables `outbox migrate` made (a long name
// whose migrations table is shortened included), in order, and nothing else: not a
// plain table of the same name, not an outbox table's own companions.
func TestFindTables(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	a, b, other := testenv.Schema(t, url), testenv.Schema(t, url), testenv.Schema(t, url)
	long := "outbox_" + strings.Repeat("x", 50) // its _migrations name is hashed
	migrate := func(schema, name string) {
		t.Helper()
		m, err := outboxpgx.New(pool, &outboxdriver.Table{Schema: schema, Name: name}).Migrator()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	migrate(a, "outbox")
	migrate(a, long)
	migrate(b, "outbox")
	migrate(b, "events")
	if _, err := pool.Exec(ctx, "CREATE TABLE "+other+".outbox (id int)"); err != nil {
		t.Fatal(err)
	}
	find := func(list string) []string {
		t.Helper()
		ps, err := outboxdriver.ParseTablePatterns(list)
		if err != nil {
			t.Fatal(err)
		}
		tables, err := outboxpgx.FindTables(ctx, pool, ps...)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tb := range tables {
			// Only this test's schemas: others' tests run beside it.
			if tb.Schema == a || tb.Schema == b || tb.Schema == other {
				names = append(names, tb.String())
			}
		}
		return names
	}
	prefix := a[:len("outbox_test_")]
	for _, tc := range []struct {
		patterns string
		want     []string
	}{
		{prefix + "*.outbox", sortedNames(a+".outbox", b+".outbox")},
		{a + ".*", sortedNames(a+".outbox", a+"."+long)},
		{b + ".events," + a + ".outbox", sortedNames(a+".outbox", b+".events")},
		{other + ".outbox", nil},
		{prefix + "*.outbox_*", []string{a + "." + long}},
	} {
		if got := find(tc.patterns); !slices.Equal(got, tc.want) {
			t.Errorf("%s: found %v, want %v", tc.patterns, got, tc.want)
		}
	}
}

func sortedNames(names ...string) []string {
	slices.Sort(names)
	return names
}

// TestPendingTables: one statement names the tables that hold an unpublished row,
// and none once every row is published.
func TestPendingTables(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	var tables []outboxdriver.Table
	for range 3 {
		tb := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "outbox"}
		m, err := outboxpgx.New(pool, &tb).Migrator()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, tb.WithDefaults())
	}
	pending := func() []string {
		t.Helper()
		got, err := outboxpgx.PendingTables(ctx, pool, tables...)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tb := range got {
			names = append(names, tb.String())
		}
		return names
	}
	if got := pending(); len(got) != 0 {
		t.Fatalf("pending with no rows: %v", got)
	}
	w, err := outbox.NewWriter(outboxpgx.New(pool, &tables[1]), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "T", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if got := pending(); !slices.Equal(got, []string{tables[1].String()}) {
		t.Fatalf("pending: %v, want %s", got, tables[1])
	}
	if _, err := pool.Exec(ctx, "UPDATE "+tables[1].Schema+".outbox SET published_at = now()"); err != nil {
		t.Fatal(err)
	}
	if got := pending(); len(got) != 0 {
		t.Fatalf("pending once published: %v", got)
	}

	// A table dropped meanwhile is named in the error; the others still answer.
	if err := w.Write(ctx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "T", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "DROP TABLE "+tables[2].Schema+".outbox"); err != nil {
		t.Fatal(err)
	}
	got, err := outboxpgx.PendingTables(ctx, pool, tables...)
	if !errors.Is(err, outboxdriver.ErrTableMissing) || !strings.Contains(err.Error(), tables[2].String()) ||
		len(got) != 1 || got[0] != tables[1] {
		t.Fatalf("with %s dropped: %v, %v; want %s pending and the dropped table named", tables[2], got, err, tables[1])
	}
}
