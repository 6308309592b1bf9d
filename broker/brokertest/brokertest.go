// Package brokertest is the conformance suite every publisher passes. A behaviour the
// relay relies on is added here first, then to each publisher.
package brokertest

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/testname"
)

// Harness is one publisher under test and a way to read back what the broker stored.
type Harness struct {
	Publisher broker.Publisher
	// Topic returns a topic of this harness's own, covered by the broker's
	// configuration (stream, exchange...), so tests do not see each other.
	Topic func(t *testing.T) string
	// Read returns the first n messages the broker stored on topic, in broker order,
	// waiting until there are n or ctx ends (then it returns what it has and an error).
	Read func(ctx context.Context, topic string, n int) ([]broker.Message, error)
	// Restart, if set, stops the broker server and starts it again.
	Restart func(t *testing.T)
	// CloudEvents is the broker's CloudEvents protocol binding (Read fills
	// Message.ContentType from the broker's content-type slot, where it has one).
	CloudEvents cloudevents.Binding
}

// NewFunc builds a fresh harness for one test.
type NewFunc func(t *testing.T) *Harness

// Run runs the suite.
func Run(t *testing.T, newHarness NewFunc) {
	t.Run("EmptyBatch", func(t *testing.T) { testEmptyBatch(t, newHarness(t)) })
	t.Run("OrderPerKey", func(t *testing.T) { testOrderPerKey(t, newHarness(t)) })
	t.Run("HeadersAndPayload", func(t *testing.T) { testHeadersAndPayload(t, newHarness(t)) })
	t.Run("Dedup", func(t *testing.T) { testDedup(t, newHarness(t)) })
	t.Run("Oversized", func(t *testing.T) { testOversized(t, newHarness(t)) })
	t.Run("CanceledContext", func(t *testing.T) { testCanceled(t, newHarness(t)) })
	t.Run("Restart", func(t *testing.T) { testRestart(t, newHarness(t)) })
	t.Run("CloudEvents", func(t *testing.T) { testCloudEvents(t, newHarness) })
}

// UniqueName returns prefix plus random hex, for topics and streams.
func UniqueName(prefix string) string { return testname.Unique(prefix) }

func msg(topic, key string, i int) broker.Message {
	return broker.Message{
		ID:            uuid.Must(uuid.NewV7()).String(),
		Topic:         topic,
		Key:           key,
		EventType:     "Tested",
		AggregateType: "test",
		AggregateID:   key,
		Payload:       []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, key, i)),
	}
}

func requireOK(t *testing.T, res []broker.Result, n int) {
	t.Helper()
	if len(res) != n {
		t.Fatalf("got %d results for %d messages", len(res), n)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func testEmptyBatch(t *testing.T, h *Harness) {
	if res := h.Publisher.Publish(ctxT(t, 10*time.Second), nil); len(res) != 0 {
		t.Fatalf("empty batch gave %d results", len(res))
	}
}

func testOrderPerKey(t *testing.T, h *Harness) {
	ctx := ctxT(t, 60*time.Second)
	topic := h.Topic(t)
	const keys, perKey, batches = 5, 60, 3
	var want []broker.Message
	for b := 0; b < batches; b++ {
		var batch []broker.Message
		for i := 0; i < perKey; i++ {
			for k := 0; k < keys; k++ {
				batch = append(batch, msg(topic, fmt.Sprintf("key-%d", k), b*perKey+i))
			}
		}
		requireOK(t, h.Publisher.Publish(ctx, batch), len(batch))
		want = append(want, batch...)
	}
	got, err := h.Read(ctx, topic, len(want))
	if err != nil {
		t.Fatalf("read back: %v (got %d of %d)", err, len(got), len(want))
	}
	last := map[string]int{}
	pos := map[string]int{}
	for i, m := range want {
		pos[m.ID] = i
	}
	for _, m := range got {
		i, ok := pos[m.ID]
		if !ok {
			t.Fatalf("unexpected message id %q", m.ID)
		}
		if prev, seen := last[m.Key]; seen && prev > i {
			t.Fatalf("key %s: message %d arrived after %d", m.Key, i, prev)
		}
		last[m.Key] = i
	}
}

func testHeadersAndPayload(t *testing.T, h *Harness) {
	ctx := ctxT(t, 30*time.Second)
	topic := h.Topic(t)
	m := msg(topic, "k1", 0)
	m.Payload = []byte("{\"bin\":\"\\u00ff\"}\x00\xff raw bytes")
	m.Headers = map[string]string{"correlationId": "corr-1", "id": "spoofed"}
	requireOK(t, h.Publisher.Publish(ctx, []broker.Message{m}), 1)
	got, err := h.Read(ctx, topic, 1)
	if err != nil {
		t.Fatal(err)
	}
	g := got[0]
	if g.ID != m.ID {
		t.Errorf("id = %q, want %q", g.ID, m.ID)
	}
	if !bytes.Equal(g.Payload, m.Payload) {
		t.Errorf("payload = %q, want %q", g.Payload, m.Payload)
	}
	if g.Key != m.Key {
		t.Errorf("key = %q, want %q", g.Key, m.Key)
	}
	if h.Publisher.Features().Headers {
		m.EachHeader(func(k, v string) {
			if g.Headers[k] != v {
				t.Errorf("header %q = %q, want %q", k, g.Headers[k], v)
			}
		})
		if g.Headers["id"] != m.ID {
			t.Errorf("an event header overrode the wire-format id: %q", g.Headers["id"])
		}
	}
}

func testDedup(t *testing.T, h *Harness) {
	if !h.Publisher.Features().BrokerDedup {
		t.Skip("publisher declares no broker dedup")
	}
	ctx := ctxT(t, 30*time.Second)
	topic := h.Topic(t)
	a, b := msg(topic, "k", 0), msg(topic, "k", 1)
	requireOK(t, h.Publisher.Publish(ctx, []broker.Message{a, a}), 2)
	requireOK(t, h.Publisher.Publish(ctx, []broker.Message{a, b}), 2)
	got, err := h.Read(ctx, topic, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].ID != a.ID || got[1].ID != b.ID {
		t.Fatalf("got ids %s,%s; want %s,%s", got[0].ID, got[1].ID, a.ID, b.ID)
	}
	// Nothing beyond the two distinct messages arrives.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if more, _ := h.Read(short, topic, 3); len(more) > 2 {
		t.Fatalf("duplicate stored: %d messages", len(more))
	}
}

func testOversized(t *testing.T, h *Harness) {
	max := h.Publisher.Features().MaxMessageBytes
	if max <= 0 {
		t.Skip("publisher declares no size limit")
	}
	ctx := ctxT(t, 30*time.Second)
	topic := h.Topic(t)
	big := msg(topic, "big", 0)
	big.Payload = bytes.Repeat([]byte("x"), max+1)
	small := msg(topic, "small", 0)
	after := msg(topic, "big", 1) // the refused message's key: must not overtake it
	res := h.Publisher.Publish(ctx, []broker.Message{big, small, after})
	if len(res) != 3 {
		t.Fatalf("got %d results", len(res))
	}
	if !broker.IsPermanent(res[0].Err) {
		t.Fatalf("oversized message: err = %v, want a permanent failure", res[0].Err)
	}
	if res[1].Err != nil {
		t.Fatalf("the other key's message failed too: %v", res[1].Err)
	}
	if !broker.IsHeldBack(res[2].Err) {
		t.Fatalf("a later message of the refused key: err = %v, want it held back", res[2].Err)
	}
	got, err := h.Read(ctx, topic, 1)
	if err != nil || got[0].ID != small.ID {
		t.Fatalf("read back %v, %v", got, err)
	}
}

func testCanceled(t *testing.T, h *Harness) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	topic := h.Topic(t)
	res := h.Publisher.Publish(ctx, []broker.Message{msg(topic, "k", 0), msg(topic, "k", 1)})
	if len(res) != 2 {
		t.Fatalf("got %d results", len(res))
	}
	for i, r := range res {
		if r.Err == nil {
			t.Fatalf("message %d acknowledged on a canceled context", i)
		}
		if broker.IsPermanent(r.Err) {
			t.Fatalf("message %d: a canceled context is not a permanent failure: %v", i, r.Err)
		}
	}
}

func testRestart(t *testing.T, h *Harness) {
	if h.Restart == nil {
		t.Skip("harness cannot restart its broker")
	}
	ctx := ctxT(t, 60*time.Second)
	topic := h.Topic(t)
	first := msg(topic, "k", 0)
	requireOK(t, h.Publisher.Publish(ctx, []broker.Message{first}), 1)
	h.Restart(t)
	second := msg(topic, "k", 1)
	// The publisher must come back on its own; the relay retries like this.
	var last error
	for attempt := 0; attempt < 100; attempt++ {
		res := h.Publisher.Publish(ctx, []broker.Message{second})
		if last = res[0].Err; last == nil {
			break
		}
		if broker.IsPermanent(last) {
			t.Fatalf("after a restart: permanent failure %v", last)
		}
		time.Sleep(100 * time.Millisecond) //nolint:forbidigo // a retry's pause, as the relay's backoff: the publisher must come back on its own
	}
	if last != nil {
		t.Fatalf("publisher did not recover after the broker restarted: %v", last)
	}
	got, err := h.Read(ctx, topic, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].ID != first.ID || got[1].ID != second.ID {
		t.Fatalf("after restart got %s,%s", got[0].ID, got[1].ID)
	}
}
