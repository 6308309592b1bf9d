package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
)

// tablesBench is `bench tables`: one `outbox relay --tables` process over many
// tables (a schema per tenant), measured idle, under a steady rate spread over the
// tables, and while one table drains a large backlog beside a quiet one; then the
// same rate through one table and a relay of its own, for comparison.
func tablesBench(dbURL, natsURL string, args []string) error {
	fs := flag.NewFlagSet("tables", flag.ExitOnError)
	n := fs.Int("tables", 500, "outbox tables, one per tenant schema")
	rate := fs.Int("rate", 500, "events per second, spread over the tables")
	seconds := fs.Int("seconds", 20, "length of the steady phase")
	backlog := fs.Int("backlog", 100000, "events put at once in one table while a quiet one is written to")
	maxConns := fs.Int("max-conns", 8, "the relay's --max-conns")
	mode := fs.String("mode", "poll", "the relay's --mode: poll, or cdc (one slot and publication for every table)")
	maxPending := fs.Int("max-pending", 0, "with -mode cdc: the relay's --max-pending (0: its default)")
	_ = fs.Parse(args)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	prefix := testenv.UniqueName("bt")
	tables := make([]outboxdriver.Table, *n)
	start := time.Now()
	for i := range tables {
		schema := fmt.Sprintf("%s_%04d", prefix, i)
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			return err
		}
		tables[i] = outboxdriver.Table{Schema: schema, Name: "outbox"}
		m, _ := outboxpgx.New(pool, &tables[i]).Migrator()
		if _, err := m.Migrate(ctx); err != nil {
			return err
		}
	}
	defer func() {
		for _, t := range tables {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+t.Schema+" CASCADE")
		}
	}()
	fmt.Printf("%d tables migrated in %s\n", *n, time.Since(start).Round(time.Second))

	js, closeStream, err := openStream(ctx, natsURL, prefix, jetstream.FileStorage)
	if err != nil {
		return err
	}
	defer closeStream()
	arrivals := newArrivals()
	cons, err := js.OrderedConsumer(ctx, prefix, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(arrivals.add)
	if err != nil {
		return err
	}
	defer cc.Stop()

	bin := filepath.Join(os.TempDir(), "outbox-bench-relay")
	if out, err := exec.Command("go", "build", "-C", "..", "-o", bin, "./cmd/outbox").CombinedOutput(); err != nil {
		return fmt.Errorf("build relay: %v\n%s", err, out)
	}
	app := prefix + "_relay"
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	relayArgs := []string{"relay", "--http=", "--db", dbURL + sep + "application_name=" + app, "--broker", natsURL,
		"--tables", prefix + "_*.outbox", "--max-conns", fmt.Sprint(*maxConns), "--topic-template", prefix + ".${aggregatetype}",
		"--log-level", env("BENCH_RELAY_LOG", "warn"), "--mode", *mode}
	if *mode == "cdc" {
		slot := prefix + "_slot"
		relayArgs = append(relayArgs, "--slot", slot)
		if *maxPending > 0 {
			relayArgs = append(relayArgs, "--max-pending", fmt.Sprint(*maxPending))
		}
		defer dropSlot(pool, slot)
	}
	cmd := exec.Command(bin, relayArgs...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer stopProcess(cmd)
	conns := func() int {
		var c int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&c)
		return c
	}
	// Every table's relay active: its lock held.
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		var held int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND a.application_name = $1", app).Scan(&held)
		if held >= *n {
			break
		}
	}
	fmt.Printf("relay up, every table active, after %s\n", time.Since(start).Round(time.Second))

	// Idle.
	time.Sleep(5 * time.Second)
	cpu0, t0 := cpuSeconds(cmd.Process.Pid), time.Now()
	peakConns := conns()
	time.Sleep(20 * time.Second)
	idleCPU := (cpuSeconds(cmd.Process.Pid) - cpu0) / time.Since(t0).Seconds()
	fmt.Printf("idle: CPU %.1f%% of a core, RSS %d MiB, %d connections\n", idleCPU*100, hwm(cmd.Process.Pid)/1024, conns())

	// Steady: the rate spread over every table.
	writers := make([]*outbox.Writer[pgx.Tx], len(tables))
	for i := range tables {
		writers[i], _ = outbox.NewWriter(outboxpgx.New(pool, &tables[i]), nil)
	}
	steady := func(pick func() int) ([]time.Duration, error) {
		committed := &sync.Map{}
		total := *rate * *seconds
		per := time.Second / time.Duration(*rate)
		var wg sync.WaitGroup
		errs := make(chan error, 1)
		next := time.Now()
		sem := make(chan struct{}, 8)
		for k := range total {
			time.Sleep(time.Until(next))
			next = next.Add(per)
			sem <- struct{}{}
			wg.Add(1)
			go func(k int) {
				defer func() { <-sem; wg.Done() }()
				evs := []outbox.Event{{AggregateType: "order", AggregateID: fmt.Sprintf("customer-%04d", k%1000), Type: "OrderPlaced", Payload: payload(k)}}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writers[pick()].WriteTx(ctx, tx, evs...) }); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				committed.Store(evs[0].ID, time.Now()) // the writer filled the id in
			}(k)
			if k%100 == 0 {
				peakConns = max(peakConns, conns())
			}
		}
		wg.Wait()
		select {
		case err := <-errs:
			return nil, err
		default:
		}
		return arrivals.latencies(committed, total, time.Minute)
	}
	cpu0, t0 = cpuSeconds(cmd.Process.Pid), time.Now()
	lat, err := steady(func() int { return rand.IntN(len(tables)) })
	if err != nil {
		return err
	}
	steadyCPU := (cpuSeconds(cmd.Process.Pid) - cpu0) / time.Since(t0).Seconds()
	fmt.Printf("steady, %d events/s over %d tables: p50 %s p99 %s max %s; CPU %.0f%% of a core, RSS %d MiB, at most %d connections\n",
		*rate, len(tables), q(lat, 0.5), q(lat, 0.99), lat[len(lat)-1].Round(time.Millisecond), steadyCPU*100, hwm(cmd.Process.Pid)/1024, peakConns)

	// One table drains a backlog while a quiet one gets an event every 100 ms.
	if _, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{tables[0].Schema, "outbox"}.Sanitize()+
		" (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'order', 'backlog-' || (g % 1000), 'OrderPlaced', '{\"n\":1}'::jsonb FROM generate_series(1, $1) g", *backlog); err != nil {
		return err
	}
	drainStart := time.Now()
	quiet := &sync.Map{}
	sent := 0
	for time.Since(drainStart) < 15*time.Second {
		evs := []outbox.Event{{AggregateType: "order", AggregateID: "quiet", Type: "OrderPlaced", Payload: payload(sent)}}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writers[1].WriteTx(ctx, tx, evs...) }); err != nil {
			return err
		}
		quiet.Store(evs[0].ID, time.Now())
		sent++
		time.Sleep(100 * time.Millisecond)
	}
	qlat, err := arrivals.latencies(quiet, sent, time.Minute)
	if err != nil {
		return err
	}
	var left int
	var took float64 // from the backlog's insert to its last row's mark, by the database's clock
	_ = pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE published_at IS NULL), coalesce(extract(epoch FROM max(published_at) - max(created_at)), 0) FROM "+
		pgx.Identifier{tables[0].Schema, "outbox"}.Sanitize()).Scan(&left, &took)
	fmt.Printf("backlog of %d in one table: the quiet table's events p50 %s p99 %s max %s (%d of them); %d of the backlog left after %s (the last marked %.2fs after the insert); relay peak RSS %d MiB\n",
		*backlog, q(qlat, 0.5), q(qlat, 0.99), qlat[len(qlat)-1].Round(time.Millisecond), sent, left, time.Since(drainStart).Round(time.Second), took, hwm(cmd.Process.Pid)/1024)
	stopProcess(cmd)

	// The same rate through one table and a relay of its own.
	single := exec.Command(bin, "relay", "--http=", "--db", dbURL, "--broker", natsURL, "--table", tables[2].String(),
		"--topic-template", prefix+".${aggregatetype}", "--log-level", env("BENCH_RELAY_LOG", "warn"), "--mode", *mode)
	if *mode == "cdc" {
		defer dropSlot(pool, pgcdc.DefaultSlot(tables[2]))
	}
	single.Stderr = os.Stderr
	if err := single.Start(); err != nil {
		return err
	}
	defer stopProcess(single)
	time.Sleep(2 * time.Second)
	lat, err = steady(func() int { return 2 })
	if err != nil {
		return err
	}
	fmt.Printf("steady, %d events/s through one table (relay --table): p50 %s p99 %s max %s\n", *rate, q(lat, 0.5), q(lat, 0.99), lat[len(lat)-1].Round(time.Millisecond))
	return nil
}

func q(lat []time.Duration, p float64) time.Duration {
	return lat[int(p*float64(len(lat)-1))].Round(100 * time.Microsecond)
}

// arrivals keeps the JetStream timestamp of every message the stream holds, by id.
type arrivals struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newArrivals() *arrivals { return &arrivals{at: map[string]time.Time{}} }

func (a *arrivals) add(m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		return
	}
	a.mu.Lock()
	a.at[m.Headers().Get("Nats-Msg-Id")] = md.Timestamp
	a.mu.Unlock()
}

// latencies waits up to timeout for the n events of committed (id -> commit time)
// and returns their commit-to-broker latencies, sorted.
func (a *arrivals) latencies(committed *sync.Map, n int, timeout time.Duration) ([]time.Duration, error) {
	var lat []time.Duration
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		lat = lat[:0]
		a.mu.Lock()
		committed.Range(func(k, v any) bool {
			if at, ok := a.at[k.(string)]; ok {
				lat = append(lat, max(0, at.Sub(v.(time.Time))))
			}
			return true
		})
		a.mu.Unlock()
		if len(lat) >= n {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d events arrived", len(lat), n)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat, nil
}

// dropSlot drops a replication slot and its publication, once no relay streams
// from it: a slot left behind keeps WAL for ever.
func dropSlot(pool *pgxpool.Pool, slot string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := testenv.DropSlot(ctx, pool, slot); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
}
