package pgcdc

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

func TestSnapshotVisible(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		snap string
		xid  uint32
		want bool
	}{
		{"100:105:100,103", 99, true},
		{"100:105:100,103", 100, false},  // running
		{"100:105:100,103", 101, true},   // ended between xmin and xmax
		{"100:105:100,103", 103, false},  // running
		{"100:105:100,103", 105, false},  // at xmax: not ended when taken
		{"100:105:100,103", 4000, false}, // past xmax
		{"100:100:", 99, true},
		// Epoch 1: the 32-bit id of a transaction of epoch 0, just before the wrap.
		{strconv.FormatUint(1<<32+5, 10) + ":" + strconv.FormatUint(1<<32+9, 10) + ":" + strconv.FormatUint(1<<32+5, 10), 1<<32 - 2, true},
		{strconv.FormatUint(1<<32+5, 10) + ":" + strconv.FormatUint(1<<32+9, 10) + ":" + strconv.FormatUint(1<<32+5, 10), 5, false},
		{strconv.FormatUint(1<<32+5, 10) + ":" + strconv.FormatUint(1<<32+9, 10) + ":" + strconv.FormatUint(1<<32+5, 10), 7, true},
		// Epoch 0, xmax just before the wrap: a new id past it is not ended.
		{"4294967290:4294967295:", 3, false},
	} {
		s, err := parseSnapshot(c.snap)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.visible(c.xid); got != c.want {
			t.Errorf("%s: visible(%d) = %v, want %v", c.snap, c.xid, got, c.want)
		}
	}
	for _, bad := range []string{"", "1:2", "1:2:3:4", "a:2:", "1:b:", "1:2:x", "5:2:", "1:2:3,"} {
		if _, err := parseSnapshot(bad); err == nil {
			t.Errorf("parseSnapshot(%q) accepted", bad)
		}
	}
}

func FuzzParseSnapshot(f *testing.F) {
	f.Add("100:105:100,103")
	f.Add("7:7:")
	f.Fuzz(func(t *testing.T, text string) {
		s, err := parseSnapshot(text)
		if err != nil {
			return
		}
		if s.xmin > s.xmax {
			t.Fatalf("%q: xmin %d after xmax %d", text, s.xmin, s.xmax)
		}
		_ = s.visible(uint32(s.xmin))
	})
}

// internalSource is a Source on a fresh, migrated table, with its statements ready.
func internalSource(t *testing.T) *Source {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := outboxdriver.Table{Schema: testenv.Schema(t, url)}
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.LogicalReplication(t, pool)
	s, err := ForDriver(drv, &Config{Logger: testenv.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.checkServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// openTx begins a transaction that the test's end rolls back if it is still open
// (a failed check must not leave it holding its locks).
func openTx(t *testing.T, s *Source) pgx.Tx {
	t.Helper()
	tx, err := s.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// returnsAfter runs f and checks it is still running until release is called,
// and ends once it has.
func returnsAfter(t *testing.T, f func() error, release func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		t.Fatalf("returned before the transaction ended: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting 10 s after the transaction ended")
	}
}

// A transaction still running (as one whose commit reached the stream but not yet
// other sessions is) is waited for; one that ended is not.
func TestWaitVisibleWaitsForARunningTransaction(t *testing.T) {
	t.Parallel()
	s := internalSource(t)
	ctx := context.Background()
	tx := openTx(t, s)
	var full uint64
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&full); err != nil {
		t.Fatal(err)
	}
	xid := uint32(full)
	returnsAfter(t, func() error { return s.waitVisible(ctx, []uint32{0, xid}) }, func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if err := s.waitVisible(ctx, []uint32{xid}); err != nil {
		t.Fatal(err)
	}
	// Seen visible, it stays visible: asked again (the marker after the claim), the
	// answer comes from the snapshot read before, with no query (a context already
	// ended would fail one).
	ended, end := context.WithCancel(ctx)
	end()
	if err := s.waitVisible(ended, []uint32{xid}); err != nil {
		t.Fatalf("a transaction seen visible was asked about again: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := s.waitVisible(cctx, []uint32{uint32(full + 1000)}); err == nil {
		t.Fatal("a transaction that has not begun was taken as visible")
	}
}

// The hold check waits for a replay (or purge) of the holding dead letter in flight,
// and then sees it: it never answers from before a commit the stream already saw.
func TestHeldCheckWaitsForAReplayInFlight(t *testing.T) {
	t.Parallel()
	s := internalSource(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.qDead+` (`+sqlrules.DeadLetterColumns+`)
VALUES (gen_random_uuid(), 'order', 'o-1', 'T', '{}', NULL, NULL, 1, now(), 1, 'refused', true)`); err != nil {
		t.Fatal(err)
	}
	held := func(want bool) func() error {
		return func() error {
			var got bool
			if err := s.pool.QueryRow(ctx, s.heldStmt, "order", "o-1").Scan(&got); err != nil {
				return err
			}
			if got != want {
				t.Errorf("held = %v, want %v", got, want)
			}
			return nil
		}
	}
	del := func() pgx.Tx {
		tx := openTx(t, s)
		if _, err := tx.Exec(ctx, `DELETE FROM `+s.qDead+` WHERE aggregateid = 'o-1'`); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	rolledBack := del()
	returnsAfter(t, held(true), func() { _ = rolledBack.Rollback(ctx) })
	committed := del()
	returnsAfter(t, held(false), func() {
		if err := committed.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Moving a streamed event to the dead letters waits until its transaction is
// visible, so its row leaves the table (before, it could stay behind, and a replay
// then failed on the id).
func TestDeadLetterWaitsForTheEventsTransaction(t *testing.T) {
	t.Parallel()
	s := internalSource(t)
	ctx := context.Background()
	tx := openTx(t, s)
	var e entry
	err := tx.QueryRow(ctx, `INSERT INTO `+s.qTable+` (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', 'o-1', 'T', '{}') RETURNING id::text, seq, pg_current_xact_id()::text::bigint % 4294967296`).
		Scan(&e.row.ID, &e.row.Seq, &e.xid)
	if err != nil {
		t.Fatal(err)
	}
	e.row.AggregateType, e.row.AggregateID, e.row.Type, e.row.Payload = "order", "o-1", "T", []byte(`{}`)
	returnsAfter(t, func() error { return s.insertDead(ctx, []deadEntry{{&e, "refused", true}}) }, func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	var inTable, inDead int
	if err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s.qTable+`), (SELECT count(*) FROM `+s.qDead+`)`).Scan(&inTable, &inDead); err != nil {
		t.Fatal(err)
	}
	if inTable != 0 || inDead != 1 {
		t.Fatalf("%d rows left in the table, %d dead letters; want 0 and 1", inTable, inDead)
	}
}
