// Package webhooktest is a webhook endpoint for tests: it records each delivery by
// its webhook-id, in arrival order per key, and can hold one key's answers (a
// receiver slow for one aggregate) for a while or until it is opened; and the
// scenario every relay mode must pass with it (SlowKey).
package webhooktest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/internal/testenv"
)

// Receiver records deliveries. Its zero value answers every delivery at once.
type Receiver struct {
	// HoldKey is the key (Outbox-Key) whose answers are held: for Hold when it is
	// positive, else until Open is called.
	HoldKey string
	Hold    time.Duration

	initOnce sync.Once
	open     chan struct{}
	openOnce sync.Once

	mu    sync.Mutex
	count map[string]int      // webhook-id -> deliveries
	order map[string][]string // key -> ids, the first delivery of each
}

func (rc *Receiver) init() {
	rc.initOnce.Do(func() {
		rc.open = make(chan struct{})
		rc.count, rc.order = map[string]int{}, map[string][]string{}
	})
}

// ServeHTTP records the delivery and answers it (204), after the hold for HoldKey.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.init()
	_, _ = io.Copy(io.Discard, r.Body)
	key, id := r.Header.Get(webhook.HeaderKey), r.Header.Get(webhook.HeaderID)
	rc.mu.Lock()
	rc.count[id]++
	if rc.count[id] == 1 {
		rc.order[key] = append(rc.order[key], id)
	}
	rc.mu.Unlock()
	if key == rc.HoldKey && rc.HoldKey != "" {
		var hold <-chan time.Time
		if rc.Hold > 0 {
			t := time.NewTimer(rc.Hold)
			defer t.Stop()
			hold = t.C
		}
		select {
		case <-hold:
		case <-rc.open:
		case <-r.Context().Done():
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// Publisher serves rc over HTTP for the length of the test and returns a webhook
// publisher to it, whose requests time out after timeout. The server closes when the
// test ends, after opening rc: a relay started later stops first.
func (rc *Receiver) Publisher(t testing.TB, timeout time.Duration) *webhook.Publisher {
	t.Helper()
	srv := httptest.NewServer(rc)
	t.Cleanup(func() {
		rc.Open()
		srv.Close()
	})
	pub, err := webhook.Dial(context.Background(), srv.URL, &webhook.Config{Secret: "s3cret", Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// Open answers HoldKey's held deliveries, and every later one at once.
func (rc *Receiver) Open() {
	rc.init()
	rc.openOnce.Do(func() { close(rc.open) })
}

// Snapshot returns how many times each id was delivered, and each key's ids in the
// order they first arrived.
func (rc *Receiver) Snapshot() (count map[string]int, order map[string][]string) {
	rc.init()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	count, order = make(map[string]int, len(rc.count)), make(map[string][]string, len(rc.order))
	for k, v := range rc.count {
		count[k] = v
	}
	for k, v := range rc.order {
		order[k] = append([]string(nil), v...)
	}
	return count, order
}

// SlowKey is the scenario a relay must pass when a receiver holds one aggregate's
// answers: the slow key holds only itself. Run it with a Receiver whose HoldKey is
// Key and which is not opened yet.
type SlowKey struct {
	Key string
	// Writer writes the scenario's events, each call in one transaction (an
	// *outbox.Writer).
	Writer interface {
		Write(ctx context.Context, events ...outbox.Event) error
	}
	// Done reports whether every id is done: delivered, and marked published where
	// the relay keeps rows.
	Done func(ids ...string) bool
	// Held, if set, runs once the first batch's other aggregates are done while the
	// slow key's answer is still held (a group member joins there, say).
	Held func()
}

// Run writes the slow key beside three others, and checks that the others are done
// while its answer is held, and so are later events of other aggregates, while its
// own next event is not sent; then it opens rc, and checks that the slow key's events
// are done in order and that no event was delivered twice.
func (s *SlowKey) Run(t testing.TB, ctx context.Context, rc *Receiver) {
	t.Helper()
	write := func(keys ...string) []string {
		t.Helper()
		evs := make([]outbox.Event, len(keys))
		for i, key := range keys {
			evs[i] = outbox.Event{AggregateType: "order", AggregateID: key, Type: "T", Payload: []byte(`{}`)}
		}
		if err := s.Writer.Write(ctx, evs...); err != nil {
			t.Fatal(err)
		}
		ids := make([]string, len(evs))
		for i := range evs {
			ids[i] = evs[i].ID
		}
		return ids
	}
	first := write(s.Key, "a", "b", "c")
	testenv.Wait(t, ctx, "the batch's other aggregates done while the slow one is held", func() bool { return s.Done(first[1:]...) })
	if s.Held != nil {
		s.Held()
	}
	second := write("a", s.Key, "d", "b")
	testenv.Wait(t, ctx, "later events of other aggregates done while the slow one is held", func() bool {
		return s.Done(second[0], second[2], second[3])
	})
	count, _ := rc.Snapshot()
	if n := count[first[0]]; n != 1 {
		t.Fatalf("the held event was sent %d times while held, want once", n)
	}
	if n := count[second[1]]; n != 0 {
		t.Fatalf("the slow aggregate's next event went out before the held one was answered (%d times)", n)
	}

	rc.Open()
	testenv.Wait(t, ctx, "the slow aggregate done once answered", func() bool { return s.Done(first[0], second[1]) })
	count, order := rc.Snapshot()
	for id, n := range count {
		if n != 1 {
			t.Errorf("event %s delivered %d times, want once", id, n)
		}
	}
	if got, want := order[s.Key], []string{first[0], second[1]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the slow aggregate delivered as %v, want %v", got, want)
	}
}
