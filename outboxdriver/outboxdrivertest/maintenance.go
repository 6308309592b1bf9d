package outboxdrivertest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
)

func testMigrate[TTx any](t *testing.T, h *Harness[TTx]) {
	m, _ := h.Driver.Migrator()
	applied, err := m.Migrate(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Fatalf("second migrate applied %v", applied)
	}
	sql, err := m.SQL()
	if err != nil || len(sql) == 0 {
		t.Fatalf("SQL() = %q, %v", sql, err)
	}
	// The migrated table is at the version this build knows.
	st, err := m.Schema(ctxT(t))
	if err != nil || !st.Managed || st.Version() != st.Latest || len(st.Pending)+len(st.Unknown) != 0 || st.Check() != nil {
		t.Fatalf("schema after migrate: %+v, %v", st, err)
	}
}

func testMissingTable[TTx any](t *testing.T, h *Harness[TTx]) {
	_, err := store(t, h).Claim(ctxT(t), &outboxdriver.ClaimParams{Limit: 10})
	if !errors.Is(err, outboxdriver.ErrTableMissing) {
		t.Fatalf("claim on a missing table: err = %v, want ErrTableMissing", err)
	}
	_, err = store(t, h).Status(ctxT(t))
	if !errors.Is(err, outboxdriver.ErrTableMissing) {
		t.Fatalf("status on a missing table: err = %v, want ErrTableMissing", err)
	}
	// A table no migration made is not managed: its version cannot be told.
	m, _ := h.Driver.Migrator()
	if st, err := m.Schema(ctxT(t)); err != nil || st.Managed || st.Check() != nil {
		t.Fatalf("schema of a table never migrated: %+v, %v", st, err)
	}
}

// testCleanup is a property test: whatever mix of published, unpublished, failing and
// delayed rows, cleanup removes only published rows older than the cutoff.
func testCleanup[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for round := 0; round < 5; round++ {
		n := 20 + rng.IntN(40)
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = event(fmt.Sprint(rng.IntN(5)), i)
			if rng.IntN(6) == 0 {
				evs[i].NotBefore = time.Now().Add(time.Hour)
			}
		}
		writeCommitted(t, h, evs...)
		c := claimAll(t, s)
		var p outboxdriver.CompleteParams
		for _, r := range c.Rows() {
			switch rng.IntN(3) {
			case 0:
				p.Published = append(p.Published, r.ID)
			case 1:
				p.Failed = append(p.Failed, outboxdriver.Failure{ID: r.ID, Error: "x", CountAttempt: true, RetryAt: time.Now().Add(time.Hour)})
			}
		}
		complete(t, c, &p)
	}
	before, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A cutoff in the past deletes nothing; one in the future deletes every published row.
	if n, err := s.Cleanup(ctx, &outboxdriver.CleanupParams{Before: time.Now().Add(-time.Hour), Limit: 1000}); err != nil || n != 0 {
		t.Fatalf("cleanup of rows published over an hour ago: %d, %v", n, err)
	}
	var total int64
	for {
		n, err := s.Cleanup(ctx, &outboxdriver.CleanupParams{Before: time.Now().Add(time.Hour), Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		total += n
		if n < 7 {
			break
		}
	}
	after, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if total != before.Published || after.Published != 0 || after.Unpublished != before.Unpublished || after.Failing != before.Failing {
		t.Fatalf("cleanup deleted %d; status before %+v, after %+v: only the %d published rows may go", total, before, after, before.Published)
	}
}
