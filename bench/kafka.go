package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// kafkaBench measures what exactly-once costs: the relay publishing to Kafka plainly
// (idempotent producer) and in transactions (--kafka-transactional-id), alternated
// on the same machine, a backlog drain and a live load each. There is no Kafka broker
// here: kfake runs in this process, so its CPU is the bench's, and the figures say
// what the relay's extra round trips cost, not what a Kafka cluster does.
func kafkaBench(dbURL string, args []string) error {
	fs := flag.NewFlagSet("kafka", flag.ExitOnError)
	events := fs.Int("events", 100_000, "backlog size")
	runs := fs.Int("runs", 3, "drains of each mode, alternated")
	batch := fs.Int("batch", 1000, "relay batch size")
	rate := fs.Int("live-rate", 2000, "live load: events/s (0: no live load)")
	seconds := fs.Int("seconds", 10, "live load: how long")
	mode := fs.String("mode", "poll", "relay mode: poll or cdc")
	_ = fs.Parse(args)

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(6), kfake.AllowAutoTopicCreation())
	if err != nil {
		return err
	}
	defer cluster.Close()
	bin := filepath.Join(os.TempDir(), "outbox-bench-relay")
	if out, err := exec.Command("go", "build", "-C", "..", "-o", bin, "./cmd/outbox").CombinedOutput(); err != nil {
		return fmt.Errorf("build relay: %v\n%s", err, out)
	}
	k := kafkaRun{cluster: cluster, dbURL: dbURL, bin: bin, brokerURL: "kafka://" + cluster.ListenAddrs()[0], addrs: cluster.ListenAddrs(), batch: *batch, mode: *mode}
	modes := []bool{false, true}
	drains := map[bool][]drainResult{}
	for i := 0; i < *runs; i++ {
		for _, tx := range modes {
			r, err := k.drain(*events, tx)
			if err != nil {
				return err
			}
			drains[tx] = append(drains[tx], r)
			fmt.Printf("drain %d, %-13s %6.0f events/s, relay CPU %.1f µs/event\n", i+1, k.label(tx)+":", r.rate(), r.cpuPerEvent())
		}
	}
	med := func(tx bool, f func(drainResult) float64) float64 {
		v := make([]float64, 0, len(drains[tx]))
		for _, r := range drains[tx] {
			v = append(v, f(r))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	plain, tx := med(false, drainResult.rate), med(true, drainResult.rate)
	fmt.Printf("\n%s mode, backlog of %d, batch %d, median of %d: plain %.0f events/s (%.1f µs/event), transactions %.0f events/s (%.1f µs/event): %.0f%% of plain\n",
		*mode, *events, *batch, *runs, plain, med(false, drainResult.cpuPerEvent), tx, med(true, drainResult.cpuPerEvent), 100*tx/plain)
	if *rate == 0 {
		return nil
	}
	for _, tx := range modes {
		lat, err := k.live(*rate, *seconds, tx)
		if err != nil {
			return err
		}
		q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(100 * time.Microsecond) }
		fmt.Printf("live %d events/s for %ds, %-13s p50 %v  p99 %v  max %v (commit to a read_committed consumer)\n",
			*rate, *seconds, k.label(tx)+":", q(0.5), q(0.99), lat[len(lat)-1].Round(100*time.Microsecond))
	}
	return nil
}

type kafkaRun struct {
	cluster               *kfake.Cluster
	dbURL, bin, brokerURL string
	addrs                 []string
	batch                 int
	mode                  string // poll or cdc
}

func (kafkaRun) label(tx bool) string {
	if tx {
		return "transactions"
	}
	return "plain"
}

// start starts a relay on table, publishing to topic (made now: the relay does not
// create topics).
func (k kafkaRun) start(table outboxdriver.Table, topic string, tx bool) (*exec.Cmd, error) {
	if err := k.cluster.CreateTopic(topic, 6, nil); err != nil {
		return nil, err
	}
	args := []string{"relay", "--http=", "--db", k.dbURL, "--broker", k.brokerURL, "--table", table.Schema + "." + table.Name,
		"--topic-template", topic, "--batch-size", strconv.Itoa(k.batch), "--log-level", env("BENCH_RELAY_LOG", "warn"), "--mode", k.mode}
	if tx {
		args = append(args, "--kafka-transactional-id", table.Schema)
	}
	cmd := exec.Command(k.bin, args...)
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

// drain times the relay through a backlog, to every row marked.
func (k kafkaRun) drain(events int, tx bool) (drainResult, error) {
	ctx := context.Background()
	pool, table, drop, err := scratchFor(ctx, k.dbURL, 4, k.mode, "rows")
	if err != nil {
		return drainResult{}, err
	}
	defer drop()
	if err := writeBacklog(ctx, pool, table, events, 1000); err != nil {
		return drainResult{}, err
	}
	start := time.Now()
	cmd, err := k.start(table, testenv.UniqueName("bench.drain"), tx)
	if err != nil {
		return drainResult{}, err
	}
	defer stopProcess(cmd)
	if err := waitMarked(ctx, pool, table, 10*time.Minute); err != nil {
		return drainResult{}, err
	}
	return drainResult{events: events, elapsed: time.Since(start), cpu: cpuSeconds(cmd.Process.Pid)}, nil
}

// waitMarked waits until no row of table is unpublished (a cheap probe, by the
// unpublished rows' index).
func waitMarked(ctx context.Context, pool *pgxpool.Pool, table outboxdriver.Table, limit time.Duration) error {
	q := "SELECT EXISTS (SELECT 1 FROM " + pgx.Identifier{table.Schema, table.Name}.Sanitize() + " WHERE published_at IS NULL)"
	for deadline := time.Now().Add(limit); ; {
		var left bool
		if err := pool.QueryRow(ctx, q).Scan(&left); err != nil {
			return err
		}
		if !left {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rows still unpublished after %v", limit)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// live commits rate events/s for seconds, 10 to a transaction, and returns each
// event's latency from its COMMIT returning to a read_committed consumer receiving it,
// sorted.
func (k kafkaRun) live(rate, seconds int, tx bool) ([]time.Duration, error) {
	ctx := context.Background()
	pool, table, drop, err := scratchFor(ctx, k.dbURL, 4, k.mode, "rows")
	if err != nil {
		return nil, err
	}
	defer drop()
	topic := testenv.UniqueName("bench.live")
	cmd, err := k.start(table, topic, tx)
	if err != nil {
		return nil, err
	}
	defer stopProcess(cmd)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		arrived   = map[string]time.Time{}
	)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now()
			mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == broker.HeaderID {
						arrived[string(h.Value)] = now
					}
				}
			})
			mu.Unlock()
		}
	}()
	time.Sleep(time.Second) // the relay is up
	w, _ := outbox.NewWriter(outboxpgx.New(pool, &table), nil)
	const perTx = 10
	every := time.Second * perTx / time.Duration(rate)
	next := time.Now()
	for i := 0; i < rate*seconds; i += perTx {
		time.Sleep(time.Until(next))
		next = next.Add(every)
		evs := make([]outbox.Event, perTx)
		for j := range evs {
			evs[j] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("customer-%04d", (i+j)%1000), Type: "OrderPlaced", Payload: payload(i + j)}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
			return nil, err
		}
		now := time.Now()
		mu.Lock()
		for _, e := range evs {
			committed[e.ID] = now
		}
		mu.Unlock()
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := len(arrived)
		mu.Unlock()
		if n >= len(committed) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d events arrived", n, len(committed))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		lat = append(lat, max(0, arrived[id].Sub(c)))
	}
	slices.Sort(lat)
	return lat, nil
}
