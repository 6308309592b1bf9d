// Package outboxdrivertest is the conformance suite every database driver passes. A
// behaviour the writer or relay relies on is added here first, then to each driver.
package outboxdrivertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
)

// Harness is one driver under test, on a table of the test's own (not yet migrated).
type Harness[TTx any] struct {
	Driver   outboxdriver.Driver[TTx]
	Begin    func(ctx context.Context) (TTx, error)
	Commit   func(ctx context.Context, tx TTx) error
	Rollback func(ctx context.Context, tx TTx) error
	// InsertPlain inserts a row with only the five Debezium columns, by plain SQL, as
	// a producer in another language would.
	InsertPlain func(ctx context.Context, id, aggregateType, aggregateID, typ, payload string) error
	// Reopen, if set, builds another driver on the same database for table (the
	// harness's own table with other options, such as a write mode).
	Reopen func(table outboxdriver.Table) outboxdriver.Driver[TTx]
	// AddColumn, if set, adds a column to the table (name, then its SQL type and
	// default): the driver reads custom columns (ClaimParams.Columns).
	AddColumn func(ctx context.Context, name, typeAndDefault string) error
	// Source, if set, opens the relay's source under test on the migrated table: a
	// source built on the driver (the CDC source), for RunSource.
	Source func(t *testing.T) outboxdriver.Source
	// MultipleClaims says the store lets two claims be held at once.
	MultipleClaims bool
	// ConcurrentWriters says two write transactions can be open at once (not SQLite).
	ConcurrentWriters bool
	// HoldRow, if set, holds the row of event id with lock from a session of its own,
	// as an operator or another tool would, until release is called.
	HoldRow func(ctx context.Context, id string, lock RowLock) (release func(), err error)
	// NonUniqueIDs says the table cannot refuse a second event with the same id
	// (a partitioned table's keys include the partition column).
	NonUniqueIDs bool
}

// NewFunc builds a fresh harness whose table has the given payload type.
type NewFunc[TTx any] func(t *testing.T, payload outboxdriver.PayloadType) *Harness[TTx]

// Run runs the suite.
func Run[TTx any](t *testing.T, newHarness NewFunc[TTx]) {
	tests := append([]suiteCase[TTx]{
		{"MigrateIdempotent", testMigrate[TTx]},
		{"MissingTable", testMissingTable[TTx]},
		{"CommitVisibleRollbackNot", testCommitRollback[TTx]},
		{"ClaimBoundedBySeq", testClaimMaxSeq[TTx]},
		{"ClaimReadsCustomColumns", testClaimColumns[TTx]},
		{"GroupFencing", testGroupFencing[TTx]},
		{"GroupFencingArchive", testGroupFencingArchive[TTx]},
		{"ClaimSkipsLocked", testSkipLocked[TTx]},
		{"ClaimTakesHeads", testHeadRule[TTx]},
		{"ClaimHeadsLiveness", testHeadRuleLiveness[TTx]},
		{"ClaimAhead", testClaimAhead[TTx]},
		{"LateCommitNotSkipped", testLateCommit[TTx]},
		{"CompleteMarksAndDeletes", testComplete[TTx]},
		{"CompleteArchives", testCompleteArchive[TTx]},
		{"CompletePublished", testCompletePublished[TTx]},
		{"PlainSQLInsert", testPlainSQL[TTx]},
		{"InvalidEventsWriteNothing", testInvalid[TTx]},
		{"DuplicateID", testDuplicate[TTx]},
		{"WriteModes", testWriteModes[TTx]},
		{"Leadership", testLeadership[TTx]},
		{"LeadershipRevokedWhenSilent", testLeadershipRevoked[TTx]},
		{"LeaderWaitsForOldClaims", testLeaderWaitsForOldClaims[TTx]},
		{"ClaimKeptAlive", testClaimKeptAlive[TTx]},
		{"CompleteAfterHoldEnded", testCompleteAfterHoldEnded[TTx]},
		{"CompleteAfterHoldEndedRowHeld", testCompleteAfterHoldEndedRowHeld[TTx]},
		{"Status", testStatus[TTx]},
		{"EventStory", testEventStory[TTx]},
		{"CleanupNeverDeletesUnpublished", testCleanup[TTx]},
		{"RetryNow", testRetryNow[TTx]},
		{"EditDeadLetter", testEditDead[TTx]},
		{"DeadPayloadPreview", testDeadPayloadPreview[TTx]},
	}, sourceCases[TTx]()...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, outboxdriver.PayloadJSON)
			if tc.name != "MissingTable" {
				migrate(t, h)
			}
			tc.fn(t, h)
		})
	}
	t.Run("BytesPayload", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, outboxdriver.PayloadBytes)
		migrate(t, h)
		testBytesPayload(t, h)
	})
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func migrate[TTx any](t *testing.T, h *Harness[TTx]) {
	t.Helper()
	m, err := h.Driver.Migrator()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctxT(t)); err != nil {
		t.Fatalf("migrate: %v", err)
	}
}

func store[TTx any](t *testing.T, h *Harness[TTx]) outboxdriver.Store {
	t.Helper()
	s, err := h.Driver.Store()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writer[TTx any](t *testing.T, h *Harness[TTx]) *outbox.Writer[TTx] {
	t.Helper()
	w, err := outbox.NewWriter(h.Driver, nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func event(agg string, n int) outbox.Event {
	return outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: agg, Type: "OrderPlaced", Payload: []byte(fmt.Sprintf(`{"n": %d}`, n))}
}

// writeCommitted writes events in one committed transaction and returns their ids.
func writeCommitted[TTx any](t *testing.T, h *Harness[TTx], evs ...outbox.Event) []string {
	t.Helper()
	ctx := ctxT(t)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := writer(t, h).WriteTx(ctx, tx, evs...); err != nil {
		_ = h.Rollback(ctx, tx)
		t.Fatal(err)
	}
	if err := h.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(evs))
	for i := range evs {
		ids[i] = evs[i].ID
	}
	return ids
}

// drain claims everything and completes it as published, returning the rows in order.
func drain(t *testing.T, s outboxdriver.Source) []outboxdriver.Row {
	t.Helper()
	ctx := ctxT(t)
	var all []outboxdriver.Row
	for {
		c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		rows := c.Rows()
		if len(rows) == 0 {
			return all
		}
		all = append(all, rows...)
		if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: ids(rows)}); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(rows []outboxdriver.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}
