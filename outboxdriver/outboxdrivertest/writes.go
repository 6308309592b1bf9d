package outboxdrivertest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
)

func testCommitRollback[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	w := writer(t, h)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTx(ctx, tx, event("rolled-back", 1)); err != nil {
		t.Fatal(err)
	}
	if err := h.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	kept := writeCommitted(t, h, event("committed", 1))
	rows := drain(t, store(t, h))
	if len(rows) != 1 || rows[0].ID != kept[0] {
		t.Fatalf("claimed %v, want only the committed event %s", ids(rows), kept[0])
	}
}

func testPlainSQL[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	id := uuid.NewString()
	if err := h.InsertPlain(ctx, id, "invoice", "inv-7", "InvoiceIssued", `{"total": 12}`); err != nil {
		t.Fatal(err)
	}
	rows := drain(t, store(t, h))
	if len(rows) != 1 {
		t.Fatalf("claimed %d rows, want 1", len(rows))
	}
	r := rows[0]
	if r.ID != id || r.AggregateType != "invoice" || r.AggregateID != "inv-7" || r.Type != "InvoiceIssued" || r.CreatedAt.IsZero() {
		t.Fatalf("row = %+v", r)
	}
	if string(r.Payload) != `{"total": 12}` {
		t.Fatalf("payload = %s", r.Payload)
	}
}

func testInvalid[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	w := writer(t, h)
	good := event("a", 1)
	for name, bad := range map[string]outbox.Event{
		"non-JSON payload":   {AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte("\xff\x00not json")},
		"empty payload":      {AggregateType: "order", AggregateID: "1", Type: "T"},
		"NUL escape":         {AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{"a":"\u0000"}`)},
		"empty aggregate id": {AggregateType: "order", Type: "T", Payload: []byte(`{}`)},
		"bad id":             {ID: "nope", AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`)},
		"reserved header":    {AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`), Headers: map[string]string{"Nats-Msg-Id": "x"}},
		"invalid UTF-8 type": {AggregateType: "order", AggregateID: "1", Type: "\xff", Payload: []byte(`{}`)},
	} {
		tx, err := h.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = w.WriteTx(ctx, tx, good, bad)
		if !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("%s: err = %v, want ErrInvalidEvent", name, err)
		}
		// The transaction is still usable: nothing was sent to the database.
		if err := h.Commit(ctx, tx); err != nil {
			t.Errorf("%s: commit after a refused write: %v", name, err)
		}
	}
	if rows := drain(t, store(t, h)); len(rows) != 0 {
		t.Fatalf("refused writes left %d rows", len(rows))
	}
}

func testDuplicate[TTx any](t *testing.T, h *Harness[TTx]) {
	if h.NonUniqueIDs {
		t.Skip("the table does not enforce unique event ids (partitioned)")
	}
	ctx := ctxT(t)
	ev := event("a", 1)
	writeCommitted(t, h, ev)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Rollback(ctx, tx) }()
	if err := writer(t, h).WriteTx(ctx, tx, ev); !errors.Is(err, outboxdriver.ErrDuplicateID) {
		t.Fatalf("duplicate id: err = %v, want ErrDuplicateID", err)
	}
}

func testBytesPayload[TTx any](t *testing.T, h *Harness[TTx]) {
	raw := []byte("\x00\xffnot json at all\n")
	ev := outbox.Event{AggregateType: "blob", AggregateID: "1", Type: "Raw", Payload: raw}
	empty := outbox.Event{AggregateType: "blob", AggregateID: "1", Type: "Empty"}
	writeCommitted(t, h, ev, empty)
	rows := drain(t, store(t, h))
	if len(rows) != 2 || string(rows[0].Payload) != string(raw) || len(rows[1].Payload) != 0 || rows[1].PayloadNull {
		t.Fatalf("rows = %+v", rows)
	}
}

// testTraceContext: the writer's trace context lands in tracingspancontext, for small
// and large writes alike.
func testTraceContext[TTx any](t *testing.T, h *Harness[TTx]) {
	const tc = "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=vendor=x"
	w, err := outbox.NewWriter(h.Driver, &outbox.Config{TraceContext: func(context.Context) string { return tc }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	s := source(t, h)
	for _, n := range []int{1, 40} {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = event("k", i)
		}
		tx, err := h.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteTx(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := h.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	rows := drainN(t, s, 41)
	if len(rows) != 41 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.TraceContext != tc {
			t.Fatalf("row %d trace context %q", r.Seq, r.TraceContext)
		}
	}
}

// testWriteModes: the table-less write modes (insert-delete, message) commit with the
// caller's transaction and leave nothing for the polling store to claim: their events
// reach a relay only through the WAL (pgcdc's TestRowsInOrderNoPhantoms relays them end to end).
// A driver that cannot write a mode refuses it when built, naming the mode.
func testWriteModes[TTx any](t *testing.T, h *Harness[TTx]) {
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteInsertDelete, outboxdriver.WriteMessage} {
		t.Run(string(mode), func(t *testing.T) {
			if h.Reopen == nil {
				t.Skip("the harness cannot open a second driver on its table")
			}
			ctx := ctxT(t)
			table := h.Driver.Table()
			table.Write = mode
			w, err := outbox.NewWriter(h.Reopen(table), nil)
			if err != nil {
				if !strings.Contains(err.Error(), string(mode)) {
					t.Fatalf("refused without naming the mode: %v", err)
				}
				t.Skipf("the driver refuses this mode: %v", err)
			}
			write := func(commit bool, evs ...outbox.Event) error {
				tx, err := h.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := w.WriteTx(ctx, tx, evs...); err != nil {
					_ = h.Rollback(ctx, tx)
					return err
				}
				if !commit {
					return h.Rollback(ctx, tx)
				}
				return h.Commit(ctx, tx)
			}
			if err := write(false, event("a", 1), event("b", 2)); err != nil {
				t.Fatalf("rolled-back write: %v", err)
			}
			if err := write(true, event("a", 3), event("b", 4)); err != nil {
				t.Fatalf("committed write: %v", err)
			}
			bad := event("a", 5)
			bad.Payload = []byte("not json")
			if err := write(true, event("a", 6), bad); !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Fatalf("invalid event: err = %v, want ErrInvalidEvent", err)
			}
			s := store(t, h)
			if rows := drain(t, s); len(rows) != 0 {
				t.Fatalf("mode %s left %d claimable rows", mode, len(rows))
			}
			// The table keeps working for a rows-mode writer next to it.
			writeCommitted(t, h, event("c", 7))
			if rows := drain(t, s); len(rows) != 1 {
				t.Fatalf("rows-mode write after %s: %d rows", mode, len(rows))
			}
		})
	}
}
