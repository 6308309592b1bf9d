package outboxpgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/pgsql"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// newStore is a store with no floor yet: its first claim probes for one.
func newStore(t *testing.T, drv *outboxpgx.Driver) *pgsql.Store {
	t.Helper()
	st, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	return st.(*pgsql.Store)
}

// publish claims what is due and marks it published, returning the claimed ids.
func publish(t *testing.T, ctx context.Context, st *pgsql.Store) []string {
	t.Helper()
	c, err := st.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(c.Rows()))
	for _, r := range c.Rows() {
		ids = append(ids, r.ID)
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: ids}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func events(aggregate string, n int) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{AggregateType: "order", AggregateID: aggregate, Type: "T", Payload: []byte(`{}`)}
	}
	return evs
}

// TestClaimFloorWaitsForALateWriter: a claim starts past the published rows, but never
// past a row whose transaction took its seq before and commits after. The floor's
// probe sees that writer holding the table's lock and waits for it to end; a floor
// set without that wait would leave its row unclaimed for good.
func TestClaimFloorWaitsForALateWriter(t *testing.T) {
	t.Parallel()
	ctx, pool, drv, w, _ := migratedTable(t)
	st := newStore(t, drv)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // a failure before the commit must not hold the pool
	late := events("late", 1)
	if err := w.WriteTx(ctx, tx, late...); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, events("b", 5)...); err != nil {
		t.Fatal(err)
	}
	// The first claim starts a probe: the lowest unpublished row it sees is b's
	// first, above the late writer's.
	if got := publish(t, ctx, st); len(got) != 5 {
		t.Fatalf("first claim took %d rows, want b's 5", len(got))
	}
	if got := publish(t, ctx, st); len(got) != 0 || st.ClaimFloor() != 0 {
		t.Fatalf("while the late writer runs: %d rows claimed, floor %d; want none and no floor", len(got), st.ClaimFloor())
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	st.ProbeFloorNow() // a probe whose writers ran looks again a second later
	got := publish(t, ctx, st)
	if len(got) != 1 || got[0] != late[0].ID {
		t.Fatalf("after the late commit the claim took %v, want the late row %s", got, late[0].ID)
	}
	if st.ClaimFloor() == 0 {
		t.Fatal("no floor once the late writer ended")
	}
}

// TestClaimFloorBelowDeadLetters: a dead letter goes back with its own seq when it is
// replayed, so the floor stays at or below the lowest dead letter's seq, and the
// replayed row is claimed before its aggregate's later rows.
func TestClaimFloorBelowDeadLetters(t *testing.T) {
	t.Parallel()
	ctx, pool, drv, w, table := migratedTable(t)
	first := events("d", 1)
	if err := w.Write(ctx, first...); err != nil {
		t.Fatal(err)
	}
	c, err := newStore(t, drv).Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil || len(c.Rows()) != 1 {
		t.Fatalf("claim: %v", err)
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{{ID: first[0].ID, Error: "refused",
		CountAttempt: true, Dead: true, HoldKey: true}}}); err != nil {
		t.Fatal(err)
	}
	rest := append(events("d", 2), events("e", 5)...)
	if err := w.Write(ctx, rest...); err != nil {
		t.Fatal(err)
	}
	later := rest[:2]
	// A store's first claim probes: the lowest unpublished row is d's second, held
	// behind the dead letter; e's rows go.
	st := newStore(t, drv)
	if got := publish(t, ctx, st); len(got) != 5 {
		t.Fatalf("claimed %d rows, want e's 5", len(got))
	}
	publish(t, ctx, st)
	var deadSeq int64
	if err := pool.QueryRow(ctx, `SELECT seq FROM `+pgx.Identifier{table.Schema, "outbox_dead"}.Sanitize()+` WHERE id = $1`,
		first[0].ID).Scan(&deadSeq); err != nil {
		t.Fatal(err)
	}
	if f := st.ClaimFloor(); f == 0 || f > deadSeq {
		t.Fatalf("floor %d, want one at or below the dead letter's seq %d", f, deadSeq)
	}
	if n, err := st.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: []string{first[0].ID}}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	got := publish(t, ctx, st)
	if len(got) != 3 || got[0] != first[0].ID || got[1] != later[0].ID || got[2] != later[1].ID {
		t.Fatalf("after the replay the claim took %v, want d's three rows, the replayed one first", got)
	}
}

// TestClaimFloorOffWhenTheIdentityCaches: an identity that caches values hands seqs out
// of order between sessions, so the store keeps no floor.
func TestClaimFloorOffWhenTheIdentityCaches(t *testing.T) {
	t.Parallel()
	ctx, pool, drv, w, table := migratedTable(t)
	if _, err := pool.Exec(ctx, `ALTER TABLE `+pgx.Identifier{table.Schema, "outbox"}.Sanitize()+` ALTER COLUMN seq SET CACHE 10`); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, events("c", 3)...); err != nil {
		t.Fatal(err)
	}
	st := newStore(t, drv)
	for range 3 {
		publish(t, ctx, st)
	}
	if f := st.ClaimFloor(); f != 0 {
		t.Fatalf("floor %d with a caching identity, want none", f)
	}
}

// TestClaimFloorDropsForARowBelowIt: a row inserted with a seq of its own below the
// floor (outside the contract: rows take their seq from the identity) is found by the
// next probe, which drops the floor, instead of waiting for a restart.
func TestClaimFloorDropsForARowBelowIt(t *testing.T) {
	t.Parallel()
	ctx, pool, drv, w, table := migratedTable(t)
	q := pgx.Identifier{table.Schema, "outbox"}.Sanitize()
	if _, err := pool.Exec(ctx, `ALTER TABLE `+q+` ALTER COLUMN seq RESTART WITH 100`); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, events("a", 5)...); err != nil {
		t.Fatal(err)
	}
	st := newStore(t, drv)
	publish(t, ctx, st) // probes
	publish(t, ctx, st) // settles
	if st.ClaimFloor() == 0 {
		t.Fatal("no floor")
	}
	id := "00000000-0000-7000-8000-000000000001"
	if _, err := pool.Exec(ctx, `INSERT INTO `+q+
		` (id, aggregatetype, aggregateid, type, payload, seq) OVERRIDING SYSTEM VALUE VALUES ($1, 'order', 'x', 'T', '{}', 50)`, id); err != nil {
		t.Fatal(err)
	}
	if got := publish(t, ctx, st); len(got) != 0 {
		t.Fatalf("claimed %v below the floor before a probe", got)
	}
	st.ProbeFloorNow()
	if got := publish(t, ctx, st); len(got) != 1 || got[0] != id {
		t.Fatalf("after the probe the claim took %v, want the row below the floor", got)
	}
}
