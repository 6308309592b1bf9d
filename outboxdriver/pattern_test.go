package outboxdriver_test

import (
	"errors"
	"testing"

	"github.com/outboxd/outbox/outboxdriver"
)

func TestTablePatterns(t *testing.T) {
	ps, err := outboxdriver.ParseTablePatterns("tenant_*.outbox, billing.events ,*.outbox_x, outbox")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"tenant_*.outbox", "billing.events", "*.outbox_x", "public.outbox"}
	for i, p := range ps {
		if p.String() != want[i] {
			t.Errorf("pattern %d = %s, want %s", i, p, want[i])
		}
	}
	if ps[0].Literal() || !ps[1].Literal() || ps[1].Table().String() != "billing.events" {
		t.Errorf("literal: %v %v %s", ps[0].Literal(), ps[1].Literal(), ps[1].Table())
	}
	for _, tc := range []struct {
		table string
		match bool
	}{
		{"tenant_1.outbox", true},
		{"tenant_.outbox", true},
		{"tenant_1.outbox_dead", false},
		{"tenant.outbox", false},
		{"billing.events", true},
		{"billing.events2", false},
		{"x.outbox_x", true},
		{"public.outbox", true},
		{"other.outbox", false},
	} {
		tb, err := outboxdriver.ParseTable(tc.table)
		if err != nil {
			t.Fatal(err)
		}
		if got := outboxdriver.MatchAny(ps, tb); got != tc.match {
			t.Errorf("%s: match %v, want %v", tc.table, got, tc.match)
		}
	}
	for _, bad := range []string{"", "a,,b", "a.b.c", "a-b", "t?", "t[1]", "tenant_*.", ".outbox", `a\*`, "1a"} {
		if _, err := outboxdriver.ParseTablePatterns(bad); !errors.Is(err, outboxdriver.ErrInvalidIdentifier) {
			t.Errorf("%q: %v, want ErrInvalidIdentifier", bad, err)
		}
	}
}

func FuzzParseTablePatterns(f *testing.F) {
	for _, s := range []string{"tenant_*.outbox", "*.*", "a,b", "a.b.c", "*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := outboxdriver.ParseTablePatterns(s)
		if err != nil {
			return
		}
		for _, p := range ps {
			// What parses round-trips, and a literal pattern names a valid table
			// that it matches.
			again, err := outboxdriver.ParseTablePattern(p.String())
			if err != nil || again != p {
				t.Fatalf("%q: %s does not round-trip: %v", s, p, err)
			}
			if p.Literal() {
				tb := p.Table()
				if err := tb.Validate(); err != nil || !p.Match(tb) {
					t.Fatalf("%q: literal %s: %v, matches itself %v", s, p, err, p.Match(tb))
				}
			}
		}
	})
}
