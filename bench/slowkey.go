package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
)

// slowKey measures what one slow aggregate costs the others: a webhook receiver
// holds every request of aggregate "slow" for -hold before answering, while
// producers write at -rate over -aggs aggregates and the slow one. It reports the
// other aggregates' commit-to-receiver latency, and how many acknowledged events were
// sent again, for three relays: no slow key (the baseline), a slow key, and a slow
// key with stragglers off (-straggler-after 0: every batch waits for all answers).
func slowKey(dbURL string, args []string) error {
	fs := flag.NewFlagSet("slowkey", flag.ExitOnError)
	hold := fs.Duration("hold", 40*time.Second, "how long the receiver holds the slow aggregate's answers")
	rate := fs.Int("rate", 500, "events per second, one per transaction")
	seconds := fs.Int("seconds", 60, "how long to write")
	aggs := fs.Int("aggs", 100, "fast aggregates")
	only := fs.String("only", "", "run one case: baseline, slow or slow-no-stragglers")
	_ = fs.Parse(args)
	cases := []struct {
		name      string
		hold      time.Duration
		straggler time.Duration
	}{
		{"baseline", 0, 0},
		{"slow", *hold, 0},
		{"slow-no-stragglers", *hold, -1},
	}
	for _, c := range cases {
		if *only != "" && c.name != *only {
			continue
		}
		r, err := runSlowKey(dbURL, c.hold, c.straggler, *rate, *seconds, *aggs)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		fmt.Printf("%-19s hold %-4v fast aggregates: %d of %d events arrived, p50 %v, p99 %v, max %v; slow aggregate: %d of %d delivered; acknowledged events sent again: %d\n",
			c.name, c.hold, len(r.lat), r.fastWritten, r.q(0.5), r.q(0.99), r.lat[len(r.lat)-1].Round(time.Millisecond), r.slowDelivered, r.slowWritten, r.resent)
	}
	return nil
}

type slowKeyResult struct {
	lat                        []time.Duration // fast aggregates' that arrived, sorted
	fastWritten                int
	slowWritten, slowDelivered int
	resent                     int
}

func (r slowKeyResult) q(p float64) time.Duration {
	return r.lat[min(len(r.lat)-1, int(p*float64(len(r.lat))))].Round(100 * time.Microsecond)
}

// holdingReceiver answers at once, but holds the slow aggregate's requests.
type holdingReceiver struct {
	hold time.Duration
	mu   sync.Mutex
	seen map[string]time.Time // first delivery of each id
	acks map[string]int       // answers given per id
}

func (h *holdingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	id := r.Header.Get(webhook.HeaderID)
	h.mu.Lock()
	if _, ok := h.seen[id]; !ok {
		h.seen[id] = time.Now()
	}
	h.mu.Unlock()
	if r.Header.Get(webhook.HeaderKey) == "slow" && h.hold > 0 {
		select {
		case <-time.After(h.hold):
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
	h.mu.Lock()
	h.acks[id]++
	h.mu.Unlock()
}

// serveReceiver serves a webhook receiver on a free loopback port and returns its URL.
func serveReceiver(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

func runSlowKey(dbURL string, hold, straggler time.Duration, rate, seconds, aggs int) (slowKeyResult, error) {
	ctx := context.Background()
	pool, table, drop, err := scratch(ctx, dbURL, 16)
	if err != nil {
		return slowKeyResult{}, err
	}
	defer drop()
	rc := &holdingReceiver{hold: hold, seen: map[string]time.Time{}, acks: map[string]int{}}
	url, stop, err := serveReceiver(rc)
	if err != nil {
		return slowKeyResult{}, err
	}
	defer stop()
	pub, err := webhook.Dial(ctx, url, &webhook.Config{Secret: "bench", Timeout: hold + 30*time.Second})
	if err != nil {
		return slowKeyResult{}, err
	}
	defer func() { _ = pub.Close() }()
	drv := outboxpgx.New(pool, &table)
	store, err := drv.Store()
	if err != nil {
		return slowKeyResult{}, err
	}
	r, err := relay.New(store, pub, &relay.Config{StragglerAfter: straggler, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return slowKeyResult{}, err
	}
	if err := r.Start(ctx); err != nil {
		return slowKeyResult{}, err
	}
	defer func() { _ = r.Stop(ctx) }()
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		return slowKeyResult{}, err
	}

	committed := map[string]time.Time{} // fast aggregates' events
	var slow []string
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i, end := 0, time.Now().Add(time.Duration(seconds)*time.Second); time.Now().Before(end); i++ {
		<-tick.C
		agg := fmt.Sprintf("a%d", i%aggs)
		if i%rate == 0 { // one event a second for the slow aggregate
			agg = "slow"
		}
		ev := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: agg, Type: "OrderPlaced", Payload: payload(i)}
		if err := w.Write(ctx, ev); err != nil {
			return slowKeyResult{}, err
		}
		if agg == "slow" {
			slow = append(slow, ev.ID)
		} else {
			committed[ev.ID] = time.Now()
		}
	}
	// Every fast event arrives, however long the slow key holds the others back (or
	// the hold and a minute pass: what arrived is reported).
	deadline := time.Now().Add(hold + 60*time.Second)
	for {
		rc.mu.Lock()
		n := 0
		for id := range committed {
			if _, ok := rc.seen[id]; ok {
				n++
			}
		}
		rc.mu.Unlock()
		if n == len(committed) {
			break
		}
		if time.Now().After(deadline) {
			break // reported: arrived of written
		}
		time.Sleep(100 * time.Millisecond)
	}
	res := slowKeyResult{slowWritten: len(slow), fastWritten: len(committed)}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for id, at := range committed {
		if seen, ok := rc.seen[id]; ok {
			res.lat = append(res.lat, seen.Sub(at))
		}
	}
	slices.Sort(res.lat)
	for _, id := range slow {
		if _, ok := rc.seen[id]; ok {
			res.slowDelivered++
		}
	}
	for _, n := range rc.acks {
		if n > 1 {
			res.resent += n - 1
		}
	}
	return res, nil
}
