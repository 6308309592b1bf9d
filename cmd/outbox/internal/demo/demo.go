// Package demo runs the whole outbox pattern on the embedded default: an order service
// writing orders and their events to SQLite (some transactions rolled back on purpose),
// relays publishing to an in-process NATS JetStream server, and a billing service
// consuming the events through an inbox. Halfway, the first relay (a separate process)
// is killed with SIGKILL right after a batch reached the broker and before it was
// marked; a second relay takes over. The result says what was lost (nothing), what was
// published twice, and who absorbed the duplicates.
package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/internal/failpoint"
	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/relay"
)

// Config configures a demo run.
type Config struct {
	Dir      string        // working folder (database files, NATS store); must exist
	Duration time.Duration // how long the order service writes
	Rate     int           // orders per second, all writers together
	// RelayCommand builds the command of the first relay process from its arguments
	// (the `outbox relay` command of this binary).
	RelayCommand func(args ...string) *exec.Cmd
	// Progress, when set, is called about five times a second.
	Progress func(p Progress)
	Logger   *slog.Logger
}

// Progress is a snapshot while the demo runs.
type Progress struct {
	Elapsed, Duration            time.Duration
	Written, Published, Consumed int64
	Phase                        string
}

// Result is the summary, and the checks that decide the exit code.
type Result struct {
	Written, RolledBack        int64         // committed and rolled-back order transactions
	Published                  int64         // distinct events that reached the broker
	Republished                int64         // publishes of an event already published (after the crash)
	DroppedByBroker            int64         // of those, dropped by JetStream's Nats-Msg-Id dedup
	Consumed                   int64         // events the billing service applied
	Redelivered                int64         // deliveries the inbox recognised and skipped
	Lost, Phantoms, OutOfOrder int64         // must all be 0
	P50, P99                   time.Duration // commit to consumed
	Takeover                   time.Duration // from the kill to the second relay's first publish
	KilledMidBatch             bool          // the first relay died between publish and mark
}

// OK reports whether every check passed.
func (r *Result) OK() bool {
	return r.Lost == 0 && r.Phantoms == 0 && r.OutOfOrder == 0 && r.Written > 0 && r.Consumed == r.Written
}

const (
	customers     = 24
	writers       = 4
	consumerName  = "billing"
	killFileName  = "kill-relay-1"
	leaseTTL      = time.Second
	drainDeadline = 60 * time.Second
)

// orderEvent is the payload of OrderPlaced: a contract, not a table row.
type orderEvent struct {
	EventVersion int    `json:"eventVersion"`
	OrderID      string `json:"orderId"`
	CustomerID   string `json:"customerId"`
	Seq          int    `json:"seq"` // per customer, so the consumer can check order
	AmountCents  int    `json:"amountCents"`
	CommittedAt  int64  `json:"writtenAtUnixNano"`
}

type demo struct {
	cfg    Config
	log    *slog.Logger
	orders *sql.DB
	drv    *outboxsqlite.Driver
	w      *outbox.Writer[*sql.Tx]

	mu        sync.Mutex
	committed map[string]string // event id -> customer, for the loss and phantom checks

	written, rolledBack, consumed, redelivered, outOfOrder atomic.Int64
	latMu                                                  sync.Mutex
	latencies                                              []time.Duration

	rawMu sync.Mutex
	raw   map[string]int // publishes seen per event id, duplicates included

	phase atomic.Value
}

// Run runs the demo. It returns an error when the demo could not run at all; failed
// checks are in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Duration <= 0 || cfg.Rate <= 0 {
		return nil, errors.New("demo: duration and rate must be positive")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &demo{cfg: cfg, log: cfg.Logger, committed: map[string]string{}, raw: map[string]int{}}
	d.phase.Store("starting")
	return d.run(ctx)
}

func (d *demo) run(ctx context.Context) (*Result, error) {
	// The broker: NATS with JetStream, in this process, on loopback.
	srv, err := natsembed.Start(filepath.Join(d.cfg.Dir, "nats"))
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUTBOX", Subjects: []string{"outbox.event.>"}, Duplicates: 2 * time.Minute}); err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	// Every publish, duplicates included, as the broker receives them.
	if _, err := nc.Subscribe("outbox.event.>", func(m *nats.Msg) {
		d.rawMu.Lock()
		d.raw[m.Header.Get(jetstream.MsgIDHeader)]++
		d.rawMu.Unlock()
	}); err != nil {
		return nil, err
	}

	// The order service's database, with its outbox.
	ordersPath := filepath.Join(d.cfg.Dir, "orders.db")
	if d.orders, err = outboxsqlite.Open(ordersPath); err != nil {
		return nil, err
	}
	defer func() { _ = d.orders.Close() }()
	if _, err := d.orders.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		return nil, err
	}
	d.drv = outboxsqlite.New(d.orders, &outboxsqlite.Options{LeaseTTL: leaseTTL})
	m, err := d.drv.Migrator()
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx); err != nil {
		return nil, err
	}
	if d.w, err = outbox.NewWriter(d.drv, nil); err != nil {
		return nil, err
	}

	// The billing service, with its own database and inbox.
	billing, err := newBilling(ctx, filepath.Join(d.cfg.Dir, "billing.db"), d)
	if err != nil {
		return nil, err
	}
	defer billing.close()
	consumeCtx, stopConsuming := context.WithCancel(ctx)
	defer stopConsuming()
	consumeDone := make(chan error, 1)
	go func() { consumeDone <- billing.consume(consumeCtx, js) }()

	// Relay 1: a separate `outbox relay` process that will be killed.
	killFile := filepath.Join(d.cfg.Dir, killFileName)
	_ = os.Remove(killFile)
	relay1 := d.cfg.RelayCommand("--db", "sqlite://"+ordersPath, "--broker", srv.URL(),
		"--poll-interval", "20ms", "--lease-ttl", leaseTTL.String(), "--log-level", "warn", "--http=")
	relay1.Env = append(os.Environ(), "OUTBOX_FAILPOINT="+failpoint.RelayAfterPublish+"@"+killFile)
	relay1.Stdout, relay1.Stderr = io.Discard, io.Discard
	if err := relay1.Start(); err != nil {
		return nil, fmt.Errorf("start relay 1: %w", err)
	}
	relay1Done := make(chan error, 1)
	go func() { relay1Done <- relay1.Wait() }()
	defer func() {
		_ = relay1.Process.Kill()
		killed := <-relay1Done // the exit error of a process killed on purpose
		_ = killed
	}()
	d.phase.Store("relay 1 (process " + fmt.Sprint(relay1.Process.Pid) + ") publishing")

	// The order service writes for the whole duration.
	start := time.Now()
	writeCtx, stopWriting := context.WithTimeout(ctx, d.cfg.Duration)
	defer stopWriting()
	var wg sync.WaitGroup
	writeErr := make(chan error, writers)
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := d.writeOrders(writeCtx, i); err != nil {
				writeErr <- err
			}
		}(i)
	}
	progressDone := make(chan struct{})
	go d.reportProgress(start, billing, progressDone)
	defer close(progressDone)

	res := &Result{}
	// Halfway: kill relay 1 at its worst moment, then start relay 2 in this process.
	sleep(ctx, d.cfg.Duration/2)
	if err := os.WriteFile(killFile, nil, 0o600); err != nil {
		return nil, err
	}
	var killedAt time.Time
	select {
	case err := <-relay1Done:
		relay1Done <- err // for the deferred cleanup
		killedAt = time.Now()
		var ee *exec.ExitError
		res.KilledMidBatch = errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	case <-time.After(10 * time.Second):
		_ = relay1.Process.Kill()
		killedAt = time.Now()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	d.phase.Store("relay 1 killed; relay 2 waiting for its lease to lapse")
	before := d.distinctPublished()
	r2, err := d.startRelay2(ctx, srv.URL())
	if err != nil {
		return nil, err
	}
	defer r2.stop()
	go func() {
		for d.distinctPublished() == before && ctx.Err() == nil && time.Since(killedAt) < drainDeadline {
			time.Sleep(5 * time.Millisecond)
		}
		res.Takeover = time.Since(killedAt)
		d.phase.Store("relay 2 publishing")
	}()

	wg.Wait()
	close(writeErr)
	for err := range writeErr {
		return nil, err
	}
	d.phase.Store("draining")
	deadline := time.Now().Add(drainDeadline)
	for (d.consumed.Load() < d.written.Load() || d.redelivered.Load() < billing.unackedCount()) &&
		time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // late duplicates, if any, still count
	stopConsuming()
	if err := <-consumeDone; err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	d.summarize(res)
	d.mu.Lock()
	res.Phantoms = billing.phantoms(d.committed)
	d.mu.Unlock()
	info, err := js.Stream(context.WithoutCancel(ctx), "OUTBOX")
	if err != nil {
		return nil, err
	}
	stored := int64(info.CachedInfo().State.Msgs)
	res.DroppedByBroker = res.Republished - (stored - res.Published)
	return res, nil
}

func (d *demo) distinctPublished() int64 {
	d.rawMu.Lock()
	defer d.rawMu.Unlock()
	return int64(len(d.raw))
}

// writeOrders is one order-service worker: it owns the customers i, i+writers, ...
// so the per-customer sequence it assigns is the commit order.
func (d *demo) writeOrders(ctx context.Context, i int) error {
	var mine []string
	for c := i; c < customers; c += writers {
		mine = append(mine, fmt.Sprintf("customer-%02d", c))
	}
	next := map[string]int{}
	tick := time.NewTicker(time.Second * writers / time.Duration(d.cfg.Rate))
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cust := mine[rand.N(len(mine))]
		orderID := fmt.Sprintf("o-%d-%d", i, n)
		rollback := rand.N(10) == 0 // one in ten transactions fails on purpose
		ev := orderEvent{EventVersion: 1, OrderID: orderID, CustomerID: cust, Seq: next[cust] + 1,
			AmountCents: 100 + rand.N(10000), CommittedAt: time.Now().UnixNano()}
		payload, _ := json.Marshal(ev)
		events := []outbox.Event{{AggregateType: "order", AggregateID: cust, Type: "OrderPlaced", Payload: payload,
			Headers: map[string]string{outbox.HeaderEventVersion: "1"}}}
		// Not the writer's context: a transaction already begun is finished, even at the end.
		tctx := context.WithoutCancel(ctx)
		tx, err := d.orders.BeginTx(tctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(tctx, `INSERT INTO orders (id, customer_id, amount_cents) VALUES (?, ?, ?)`, orderID, cust, ev.AmountCents); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := d.w.WriteTx(tctx, tx, events...); err != nil {
			_ = tx.Rollback()
			return err
		}
		if rollback {
			_ = tx.Rollback()
			d.rolledBack.Add(1)
			continue
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		next[cust]++
		d.mu.Lock()
		d.committed[events[0].ID] = cust
		d.mu.Unlock()
		d.written.Add(1)
	}
}

type relay2 struct {
	r *relay.Relay
	p *natspub.Publisher
}

func (r *relay2) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = r.r.Stop(ctx)
	_ = r.p.Close()
}

// startRelay2 runs the second relay in this process on the order service's driver,
// so the writer's notifications wake it.
func (d *demo) startRelay2(ctx context.Context, url string) (*relay2, error) {
	pub, err := natspub.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	store, err := d.drv.Store()
	if err != nil {
		return nil, err
	}
	r, err := relay.New(store, pub, &relay.Config{
		PollInterval: 100 * time.Millisecond,
		LeaderRetry:  100 * time.Millisecond,
		LeaderCheck:  leaseTTL / 4,
		Logger:       d.log,
	})
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	return &relay2{r: r, p: pub}, nil
}

func (d *demo) reportProgress(start time.Time, b *billing, done <-chan struct{}) {
	if d.cfg.Progress == nil {
		return
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		d.cfg.Progress(Progress{
			Elapsed: time.Since(start), Duration: d.cfg.Duration,
			Written: d.written.Load(), Published: d.distinctPublished(), Consumed: d.consumed.Load(),
			Phase: d.phase.Load().(string),
		})
	}
}

func (d *demo) summarize(res *Result) {
	res.Written, res.RolledBack = d.written.Load(), d.rolledBack.Load()
	res.Consumed, res.Redelivered = d.consumed.Load(), d.redelivered.Load()
	res.OutOfOrder = d.outOfOrder.Load()
	d.rawMu.Lock()
	res.Published = int64(len(d.raw))
	for _, n := range d.raw {
		res.Republished += int64(n - 1)
	}
	d.rawMu.Unlock()
	d.mu.Lock()
	res.Lost = int64(len(d.committed)) - res.Consumed
	d.mu.Unlock()
	d.latMu.Lock()
	slices.Sort(d.latencies)
	if n := len(d.latencies); n > 0 {
		res.P50 = d.latencies[n*50/100]
		res.P99 = d.latencies[min(n-1, n*99/100)]
	}
	d.latMu.Unlock()
}

func sleep(ctx context.Context, dur time.Duration) {
	select {
	case <-time.After(dur):
	case <-ctx.Done():
	}
}
