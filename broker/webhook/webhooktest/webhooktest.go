// Package webhooktest is a webhook endpoint for tests: it records each delivery by
// its webhook-id, in arrival order per key, and can hold one key's answers (a
// receiver slow for one aggregate) for a while or until it is opened.
package webhooktest

import (
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/outboxd/outbox/broker/webhook"
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
