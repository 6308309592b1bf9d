package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/replay"
)

// replayBeside measures what a replay costs live delivery: producers write at -rate
// while the relay delivers to a webhook receiver, first alone, then with `outbox
// replay` sending a -history of published events to the same receiver, unbounded or
// at -replay-rate. It reports the live events' commit-to-receiver latency in both
// phases, and the replay's throughput.
func replayBeside(dbURL string, args []string) error {
	fs := flag.NewFlagSet("replay", flag.ExitOnError)
	rate := fs.Int("rate", 300, "live events per second, one per transaction")
	seconds := fs.Int("seconds", 30, "how long each phase writes")
	history := fs.Int("history", 100_000, "published events kept, for the replay")
	replayRate := fs.Float64("replay-rate", 0, "the replay's --rate (0: no bound)")
	_ = fs.Parse(args)
	ctx := context.Background()
	pool, table, drop, err := scratch(ctx, dbURL, 16)
	if err != nil {
		return err
	}
	defer drop()
	// The history: published rows, as mark completion keeps them.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.String()+` (aggregatetype, aggregateid, type, payload, published_at)
SELECT 'order', 'h' || (i % 1000), 'OrderPlaced', jsonb_build_object('i', i, 'pad', repeat('x', 150)), now() FROM generate_series(1, $1) AS i`, *history); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+table.String()); err != nil {
		return err
	}
	rc := &timingReceiver{live: map[string]time.Time{}}
	url, stop, err := serveReceiver(rc)
	if err != nil {
		return err
	}
	defer stop()
	dial := func() (*webhook.Publisher, error) { return webhook.Dial(ctx, url, &webhook.Config{Secret: "bench"}) }
	pub, err := dial()
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	drv := outboxpgx.New(pool, &table)
	store, err := drv.Store()
	if err != nil {
		return err
	}
	r, err := relay.New(store, pub, &relay.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = r.Stop(ctx) }()
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		return err
	}
	phase := func() ([]time.Duration, error) {
		committed := map[string]time.Time{}
		tick := time.NewTicker(time.Second / time.Duration(*rate))
		defer tick.Stop()
		for i, end := 0, time.Now().Add(time.Duration(*seconds)*time.Second); time.Now().Before(end); i++ {
			<-tick.C
			ev := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: fmt.Sprintf("a%d", i%100), Type: "OrderPlaced", Payload: payload(i)}
			if err := w.Write(ctx, ev); err != nil {
				return nil, err
			}
			committed[ev.ID] = time.Now()
		}
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			rc.mu.Lock()
			n := 0
			for id := range committed {
				if _, ok := rc.live[id]; ok {
					n++
				}
			}
			rc.mu.Unlock()
			if n == len(committed) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		var lat []time.Duration
		rc.mu.Lock()
		for id, at := range committed {
			if seen, ok := rc.live[id]; ok {
				lat = append(lat, seen.Sub(at))
			}
		}
		rc.mu.Unlock()
		slices.Sort(lat)
		return lat, nil
	}
	report := func(name string, lat []time.Duration) {
		q := func(p float64) time.Duration {
			return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(100 * time.Microsecond)
		}
		fmt.Printf("%-15s live events %d, p50 %v, p99 %v, max %v\n", name, len(lat), q(0.5), q(0.99), lat[len(lat)-1].Round(time.Millisecond))
	}
	alone, err := phase()
	if err != nil {
		return err
	}
	report("alone", alone)

	rpub, err := dial()
	if err != nil {
		return err
	}
	defer func() { _ = rpub.Close() }()
	type outcome struct {
		res  replay.Result
		err  error
		took time.Duration
	}
	done := make(chan outcome, 1)
	go func() {
		start := time.Now()
		res, err := replay.New(pool, table).Run(ctx, rpub, &replay.Config{Name: "bench", Rate: *replayRate,
			Logger: slog.New(slog.DiscardHandler)})
		done <- outcome{res, err, time.Since(start)}
	}()
	beside, err := phase()
	if err != nil {
		return err
	}
	report("beside replay", beside)
	o := <-done
	if o.err != nil {
		return o.err
	}
	fmt.Printf("replay: %d events in %v (%.0f/s), while the live phase ran %ds\n", o.res.Sent, o.took.Round(time.Millisecond),
		float64(o.res.Sent)/o.took.Seconds(), *seconds)
	return nil
}

// timingReceiver records when each live (not replayed) event first arrived.
type timingReceiver struct {
	mu   sync.Mutex
	live map[string]time.Time
}

func (h *timingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if r.Header.Get(replay.HeaderReplay) == "" {
		id := r.Header.Get(webhook.HeaderID)
		h.mu.Lock()
		if _, ok := h.live[id]; !ok {
			h.live[id] = time.Now()
		}
		h.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
}
