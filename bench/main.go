// Command bench measures the outbox against the machine's PostgreSQL and NATS. It is a
// module of its own, so Watermill (compared against) never enters the library's
// go.mod; run it from the repository's root with go run -C bench . <name>:
//
//	go run -C bench . compare [-events 200000] [-plot ../docs/bench-compare.svg] [-live-rate 5000] [-latency-plot ../docs/bench-latency.svg]  every relay and Watermill's forwarder, backlog and live load, one run
//	go run -C bench . limits  [-events 200000]   the machine's ceilings: claim+mark, a discarding replication reader, JetStream publishes
//	go run -C bench . drain   [-events 200000] [-batch 1000] [-completion mark|delete|archive]   relay throughput and RSS
//	go run -C bench . produce [-tx 20000] [-conns 8] [-per-tx 1]           writer vs hand-written INSERT
//	go run -C bench . notify  [-seconds 5] [-conns 16]                     what NOTIFY costs producers
//	go run -C bench . latency [-rate 5000] [-seconds 10] [-mode cdc] [-write message]  commit-to-broker latency
//	go run -C bench . kafka   [-events 100000] [-runs 3] [-live-rate 2000] [-mode cdc]  exactly-once's cost: plain and transactional Kafka publishing (kfake), alternated
//	go run -C bench . slowkey [-hold 40s] [-rate 500] [-seconds 60]       what one slow aggregate costs the others
//
// Each run works in a schema and stream of its own and removes them afterwards. The
// results are recorded in docs/benchmarks.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bench compare|limits|kafka|drain|produce|notify|latency|slowkey|replay|tables [flags]")
		os.Exit(2)
	}
	dbURL := env("TEST_DATABASE_URL", testenv.DatabaseURLDefault)
	natsURL := env("TEST_NATS_URL", natstest.URLDefault)
	var err error
	switch os.Args[1] {
	case "drain":
		err = drain(dbURL, natsURL, os.Args[2:])
	case "produce":
		err = produce(dbURL, os.Args[2:])
	case "notify":
		err = notify(dbURL, os.Args[2:])
	case "latency":
		err = latency(dbURL, natsURL, os.Args[2:])
	case "limits":
		err = limits(dbURL, natsURL, os.Args[2:])
	case "compare":
		err = compare(dbURL, natsURL, os.Args[2:])
	case "kafka":
		err = kafkaBench(dbURL, os.Args[2:])
	case "slowkey":
		err = slowKey(dbURL, os.Args[2:])
	case "replay":
		err = replayBeside(dbURL, os.Args[2:])
	case "tables":
		err = tablesBench(dbURL, natsURL, os.Args[2:])
	case "wm-forwarder":
		err = wmForwarder(os.Args[2:])
	case "cdc-peer":
		err = cdcPeer(os.Args[2:])

	default:
		err = fmt.Errorf("unknown benchmark %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// scratch creates a schema with a migrated outbox table and returns a pool and a drop func.
func scratch(ctx context.Context, dbURL string, conns int32) (*pgxpool.Pool, outboxdriver.Table, func(), error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, outboxdriver.Table{}, nil, err
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, outboxdriver.Table{}, nil, err
	}
	schema := testenv.UniqueName("bench_")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		pool.Close()
		return nil, outboxdriver.Table{}, nil, err
	}
	table := outboxdriver.Table{Schema: schema, Name: "outbox"}
	m, _ := outboxpgx.New(pool, &table).Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		pool.Close()
		return nil, table, nil, err
	}
	drop := func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
	return pool, table, drop, nil
}

func payload(i int) []byte {
	// about 200 bytes, like a small business event
	return []byte(fmt.Sprintf(`{"eventVersion":1,"orderId":"order-%08d","customerId":"customer-%04d","totalCents":%d,"currency":"EUR","lines":[{"sku":"SKU-%05d","qty":%d}],"note":"%s"}`,
		i, i%1000, 1000+i%9000, i%50000, 1+i%5, strings.Repeat("x", 40)))
}

func drain(dbURL, natsURL string, args []string) error {
	var o drainOpts
	fs := flag.NewFlagSet("drain", flag.ExitOnError)
	fs.IntVar(&o.events, "events", 200_000, "backlog size")
	fs.IntVar(&o.batch, "batch", 1000, "relay batch size")
	fs.StringVar(&o.completion, "completion", "mark", "what the relay does with published rows: mark, delete or archive")
	fs.StringVar(&o.mode, "mode", "poll", "relay mode: poll or cdc")
	fs.StringVar(&o.write, "write", "rows", "cdc: the writer's mode: rows, insert-delete or message (table-less)")
	fs.IntVar(&o.perTx, "per-tx", 1000, "events per producer transaction in the backlog")
	fs.StringVar(&o.storage, "storage", "file", "the JetStream stream's storage: file or memory")
	fs.IntVar(&o.relays, "relays", 0, "poll mode: run this many relays as a group (--group); 0: one relay, not a group")
	_ = fs.Parse(args)
	r, err := runDrain(dbURL, natsURL, o)
	if err != nil {
		return err
	}
	fmt.Printf("drained %d events in %v (all completed after %v): %.0f events/s (mode %s, write %s, batch %d, completion %s, %s storage, %d relays in a group); stream holds %d; relay peak RSS %.1f MiB, relays' CPU %.1fs (%.1f µs/event)\n",
		r.events, r.elapsed.Round(time.Millisecond), r.completed.Round(time.Millisecond), r.rate(), o.mode, o.write, o.batch, o.completion, o.storage, o.relays, r.stored, r.rssMiB(), r.cpu, r.cpuPerEvent())
	return nil
}

// drainOpts are one drain run's settings.
type drainOpts struct {
	events, batch, perTx, relays     int
	completion, mode, write, storage string
}

// drainResult is what one drain run measured.
type drainResult struct {
	events             int
	elapsed, completed time.Duration
	cpu                float64 // the relay processes' CPU seconds
	pgCPU, natsCPU     float64 // PostgreSQL's and nats-server's CPU seconds meanwhile
	rss                int64   // peak RSS, KiB
	stored             uint64
}

func (r drainResult) rate() float64        { return float64(r.events) / r.elapsed.Seconds() }
func (r drainResult) rssMiB() float64      { return float64(r.rss) / 1024 }
func (r drainResult) cpuPerEvent() float64 { return r.cpu / float64(r.events) * 1e6 }

// allPerEvent is the CPU the relay, PostgreSQL and nats-server spent per event, µs.
func (r drainResult) allPerEvent() float64 {
	return (r.cpu + r.pgCPU + r.natsCPU) / float64(r.events) * 1e6
}

// busy is the share of the machine's CPUs the three kept busy during the drain: near
// 1, the drain is bound by the CPU, and only less work per event makes it faster.
func (r drainResult) busy() float64 {
	return (r.cpu + r.pgCPU + r.natsCPU) / r.elapsed.Seconds() / float64(runtime.NumCPU())
}

// runDrain writes a backlog, starts the relay binary and times it to the broker.
func runDrain(dbURL, natsURL string, o drainOpts) (drainResult, error) {
	ctx := context.Background()

	pool, table, drop, err := scratchFor(ctx, dbURL, 8, o.mode, o.write)
	if err != nil {
		return drainResult{}, err
	}
	defer drop()
	if err := writeBacklog(ctx, pool, table, o.events, o.perTx); err != nil {
		return drainResult{}, err
	}

	prefix := testenv.UniqueName("bench")
	st := jetstream.FileStorage
	if o.storage == "memory" {
		st = jetstream.MemoryStorage
	}
	js, closeStream, err := openStream(ctx, natsURL, prefix, st)
	if err != nil {
		return drainResult{}, err
	}
	defer closeStream()

	// The relay builds in the library's module, the directory above.
	bin := filepath.Join(os.TempDir(), "outbox-bench-relay")
	if out, err := exec.Command("go", "build", "-C", "..", "-o", bin, "./cmd/outbox").CombinedOutput(); err != nil {
		return drainResult{}, fmt.Errorf("build relay: %v\n%s", err, out)
	}
	rargs := []string{"relay", "--http=", "--db", dbURL, "--broker", natsURL, "--table", table.Schema + "." + table.Name, "--mode", o.mode,
		"--topic-template", prefix + ".${aggregatetype}", "--batch-size", strconv.Itoa(o.batch), "--log-level", env("BENCH_RELAY_LOG", "warn")}
	rargs = append(rargs, "--completion", o.completion) // both modes: the CDC relay completes rows too
	var cmds []*exec.Cmd
	for i := 0; i < max(o.relays, 1); i++ {
		args := rargs
		if o.relays > 0 {
			args = append(slices.Clone(rargs), "--group", "--relay-id", fmt.Sprintf("bench-%d", i))
		}
		cmd := exec.Command(bin, args...)
		cmd.Stderr = os.Stderr
		cmds = append(cmds, cmd)
	}
	start := time.Now()
	for _, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			return drainResult{}, err
		}
		defer stopProcess(cmd)
	}
	var marked func() error
	if o.mode == "poll" {
		// A poll drain is done once every row is marked too.
		q := "SELECT count(*) FROM " + pgx.Identifier{table.Schema, table.Name}.Sanitize() + " WHERE published_at IS NULL"
		marked = func() error {
			for {
				var left int64
				if err := pool.QueryRow(ctx, q).Scan(&left); err != nil || left == 0 {
					return err
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return watchStream(ctx, js, prefix, o.events, start, cmds, marked)
}

// watchStream waits for the stream to hold n messages (and then for done, if set: the
// rows marked), sampling the processes' peak RSS, and returns the drain's measures,
// with PostgreSQL's and NATS's CPU meanwhile, which it prints.
func watchStream(ctx context.Context, js jetstream.JetStream, stream string, n int, start time.Time, cmds []*exec.Cmd, done func() error) (drainResult, error) {
	var r drainResult
	natsPID := pidOf("nats-server")
	natsCPU, pg0 := cpuSeconds(natsPID), postgresCPU()
	// Watch the stream, not the table: counting a 200,000-row backlog every few
	// milliseconds would steal the CPU the relay is being measured on.
	for r.stored < uint64(n) {
		info, err := js.Stream(ctx, stream)
		if err != nil {
			return r, err
		}
		r.stored = info.CachedInfo().State.Msgs
		for _, cmd := range cmds {
			r.rss = max(r.rss, hwm(cmd.Process.Pid))
		}
		if time.Since(start) > 10*time.Minute {
			return r, fmt.Errorf("stream holds %d of %d after 10 minutes", r.stored, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.events, r.elapsed = n, time.Since(start)
	if done != nil {
		if err := done(); err != nil {
			return r, err
		}
	}
	r.completed = time.Since(start)
	for _, cmd := range cmds {
		r.rss = max(r.rss, hwm(cmd.Process.Pid))
		r.cpu += cpuSeconds(cmd.Process.Pid)
	}
	pgCPU := postgresCPU().since(pg0)
	r.pgCPU, r.natsCPU = pgCPU.total(), cpuSeconds(natsPID)-natsCPU
	fmt.Printf("CPU during the drain: PostgreSQL %.1fs (%s), nats-server %.1fs\n", r.pgCPU, pgCPU, r.natsCPU)
	return r, nil
}

// scratchFor is scratch for a relay mode and a write mode: in CDC mode the slot is
// created before anything is written, and dropped with the schema.
func scratchFor(ctx context.Context, dbURL string, conns int32, mode, write string) (*pgxpool.Pool, outboxdriver.Table, func(), error) {
	pool, table, drop, err := scratch(ctx, dbURL, conns)
	if err != nil {
		return nil, table, nil, err
	}
	table.Write = outboxdriver.WriteMode(write)
	if mode != "cdc" {
		return pool, table, drop, nil
	}
	_, stopCDC, err := initCDC(ctx, pool, table)
	if err != nil {
		drop()
		return nil, table, nil, err
	}
	return pool, table, func() { stopCDC(); drop() }, nil
}

// initCDC creates the table's publication and slot (as `outbox migrate --cdc`) and
// returns the source that names them and a func that drops them.
func initCDC(ctx context.Context, pool *pgxpool.Pool, table outboxdriver.Table) (*pgcdc.Source, func(), error) {
	src, err := pgcdc.ForDriver(outboxpgx.New(pool, &table), &pgcdc.Config{})
	if err != nil {
		return nil, nil, err
	}
	if err := src.Init(ctx); err != nil {
		return nil, nil, err
	}
	return src, func() {
		if err := testenv.DropSlot(context.Background(), pool, src.Slot()); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
	}, nil
}

// stopProcess asks a relay to stop (so it can flush a CPU profile) and kills it if it
// does not within 10 s.
func stopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.AfterFunc(10*time.Second, func() { _ = cmd.Process.Kill() })
	_ = cmd.Wait()
	t.Stop()
}

// pgProcs is the CPU seconds so far of each PostgreSQL process, by pid, with its kind
// (its title: "walsender", "autovacuum worker", "checkpointer", a client backend...).
type pgProcs map[int]pgProc

type pgProc struct {
	kind string
	cpu  float64
}

// postgresCPU reads every process named postgres.
func postgresCPU() pgProcs {
	out, _ := exec.Command("pgrep", "-x", "postgres").Output()
	ps := pgProcs{}
	for _, f := range strings.Fields(string(out)) {
		pid, _ := strconv.Atoi(f)
		ps[pid] = pgProc{kind: pgKind(pid), cpu: cpuSeconds(pid)}
	}
	return ps
}

// pgKind names a PostgreSQL process by its title: "postgres: walsender …",
// "postgres: autovacuum worker", "postgres: user db host(port) idle" (a client
// backend), or the server itself.
func pgKind(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	title := strings.TrimPrefix(strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " "), "postgres: ")
	if i := strings.Index(title, ": "); i >= 0 && !strings.Contains(title[:i], " ") {
		title = title[i+2:] // the cluster's name first ("15/main: walsender …")
	}
	for _, k := range []string{"walsender", "autovacuum", "checkpointer", "background writer", "walwriter", "logical replication", "stats", "archiver"} {
		if strings.HasPrefix(title, k) {
			return k
		}
	}
	if strings.Contains(title, "(") { // user db host(port) state
		return "backends"
	}
	return "other"
}

// pgCPU is what PostgreSQL's processes spent between two readings, by kind: a process
// that ended in between (an autovacuum worker) is counted up to the first reading only.
type pgCPU map[string]float64

func (end pgProcs) since(start pgProcs) pgCPU {
	out := pgCPU{}
	for pid, p := range end {
		out[p.kind] += p.cpu - start[pid].cpu
	}
	return out
}

func (c pgCPU) total() float64 {
	var t float64
	for _, v := range c {
		t += v
	}
	return t
}

// String lists the kinds that spent a tenth of a second or more, the most first.
func (c pgCPU) String() string {
	kinds := make([]string, 0, len(c))
	for k, v := range c {
		if v >= 0.1 {
			kinds = append(kinds, k)
		}
	}
	sort.Slice(kinds, func(i, j int) bool { return c[kinds[i]] > c[kinds[j]] })
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %.1fs", k, c[k])
	}
	return strings.Join(parts, ", ")
}

// pidOf is the pid of the first process named name (0 if none).
func pidOf(name string) int {
	out, _ := exec.Command("pgrep", "-o", "-x", name).Output()
	pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return pid
}

// cpuSeconds is a process's user+system CPU time so far.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// the fields after the command name, which ends with ')'
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // clock ticks at 100 Hz
}

// hwm is a process's peak resident set in KiB (VmHWM), 0 if unknown.
func hwm(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

func produce(dbURL string, args []string) error {
	fs := flag.NewFlagSet("produce", flag.ExitOnError)
	txs := fs.Int("tx", 20_000, "transactions per variant")
	conns := fs.Int("conns", 8, "concurrent producers")
	perTx := fs.Int("per-tx", 1, "events per transaction")
	rounds := fs.Int("rounds", 3, "alternating rounds per variant")
	notifyOn := fs.Bool("notify", true, "the writer sends its (debounced) wake-up notifications, as by default")
	_ = fs.Parse(args)
	ctx := context.Background()
	pool, table, drop, err := scratch(ctx, dbURL, int32(*conns))
	if err != nil {
		return err
	}
	defer drop()
	wcfg := &outbox.Config{}
	if !*notifyOn {
		wcfg.NotifyInterval = -1
	}
	w, _ := outbox.NewWriter(outboxpgx.New(pool, &table), wcfg)
	qt := pgx.Identifier{table.Schema, table.Name}.Sanitize()
	var hand strings.Builder
	hand.WriteString("INSERT INTO " + qt + " (id, aggregatetype, aggregateid, type, payload) VALUES ")
	for i := 0; i < *perTx; i++ {
		if i > 0 {
			hand.WriteString(",")
		}
		fmt.Fprintf(&hand, "($%d,$%d,$%d,$%d,$%d)", i*5+1, i*5+2, i*5+3, i*5+4, i*5+5)
	}
	handSQL := hand.String()

	run := func(name string, body func(tx pgx.Tx, evs []outbox.Event) error) (time.Duration, error) {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, *conns)
		start := time.Now()
		for c := 0; c < *conns; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1))
					if i > *txs {
						return
					}
					evs := make([]outbox.Event, *perTx)
					for j := range evs {
						evs[j] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("customer-%04d", i%1000), Type: "OrderPlaced", Payload: payload(i)}
					}
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return body(tx, evs) }); err != nil {
						errs <- fmt.Errorf("%s: %w", name, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return time.Since(start), <-errs
	}
	writer := func(tx pgx.Tx, evs []outbox.Event) error { return w.WriteTx(ctx, tx, evs...) }
	handWritten := func(tx pgx.Tx, evs []outbox.Event) error {
		args := make([]any, 0, len(evs)*5)
		for _, e := range evs {
			args = append(args, uuid.Must(uuid.NewV7()).String(), e.AggregateType, e.AggregateID, e.Type, string(e.Payload))
		}
		_, err := tx.Exec(ctx, handSQL, args...)
		return err
	}
	var tw, th time.Duration
	for r := 0; r < *rounds; r++ {
		// Each round the other one goes first: the table grows as they write, so the
		// second of a pair always writes into a larger table and index.
		var d, d2 time.Duration
		var err error
		if r%2 == 0 {
			if d, err = run("hand-written INSERT", handWritten); err == nil {
				d2, err = run("writer", writer)
			}
		} else {
			if d2, err = run("writer", writer); err == nil {
				d, err = run("hand-written INSERT", handWritten)
			}
		}
		if err != nil {
			return err
		}
		th += d
		tw += d2
		fmt.Printf("round %d: hand-written %.0f tx/s, writer %.0f tx/s\n", r+1, float64(*txs)/d.Seconds(), float64(*txs)/d2.Seconds())
	}
	fmt.Printf("notify=%v, %d conns, %d event(s)/tx, %d tx x %d rounds: hand-written INSERT %.0f tx/s, writer %.0f tx/s: writer is %+.1f%% slower\n",
		*notifyOn, *conns, *perTx, *txs, *rounds, float64(*txs**rounds)/th.Seconds(), float64(*txs**rounds)/tw.Seconds(), (tw.Seconds()/th.Seconds()-1)*100)
	return nil
}

func notify(dbURL string, args []string) error {
	fs := flag.NewFlagSet("notify", flag.ExitOnError)
	seconds := fs.Int("seconds", 5, "seconds per variant")
	conns := fs.Int("conns", 16, "concurrent producers")
	_ = fs.Parse(args)
	ctx := context.Background()
	pool, table, drop, err := scratch(ctx, dbURL, int32(*conns))
	if err != nil {
		return err
	}
	defer drop()
	variants := []struct {
		name     string
		interval time.Duration
	}{
		{"no NOTIFY", -1},
		{"NOTIFY in every transaction", time.Nanosecond},
		{"debounced NOTIFY (default, 50ms)", outbox.NotifyIntervalDefault},
	}
	for round := 0; round < 2*len(variants); round++ {
		v := variants[round%len(variants)]
		w, _ := outbox.NewWriter(outboxpgx.New(pool, &table), &outbox.Config{NotifyInterval: v.interval})
		var n atomic.Int64
		deadline := time.Now().Add(time.Duration(*seconds) * time.Second)
		var wg sync.WaitGroup
		for c := 0; c < *conns; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				for i := 0; time.Now().Before(deadline); i++ {
					ev := outbox.Event{AggregateType: "order", AggregateID: strconv.Itoa(c), Type: "T", Payload: payload(i)}
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, ev) }); err == nil {
						n.Add(1)
					}
				}
			}(c)
		}
		wg.Wait()
		fmt.Printf("%-36s %6.0f commits/s (%d producers)\n", v.name, float64(n.Load())/float64(*seconds), *conns)
	}
	return nil
}

// latency writes events at a steady rate (one per transaction) while a relay runs, and
// measures from each producer's COMMIT returning to JetStream storing the message (its
// timestamp; the acknowledgement follows at once).
func latency(dbURL, natsURL string, args []string) error {
	fs := flag.NewFlagSet("latency", flag.ExitOnError)
	o := liveOpts{}
	fs.IntVar(&o.rate, "rate", 5000, "events per second")
	fs.IntVar(&o.seconds, "seconds", 10, "how long to write")
	fs.StringVar(&o.mode, "mode", "cdc", "relay mode: poll or cdc")
	fs.StringVar(&o.write, "write", "message", "the writer's mode: rows, insert-delete or message")
	fs.StringVar(&o.completion, "completion", "", "poll mode: mark, delete or archive (default: the relay's)")
	fs.IntVar(&o.conns, "conns", 8, "producer connections")
	fs.BoolVar(&o.inProcess, "in-process", false, "run the relay inside the benchmark instead of as `outbox relay`")
	fs.IntVar(&o.perTx, "per-tx", 1, "events per transaction")
	_ = fs.Parse(args)
	r, err := runLive(dbURL, natsURL, o)
	if err != nil {
		return err
	}
	fmt.Printf("%d events at %.0f/s, %d per transaction (mode %s, write %s, relay in process %v): commit-to-broker latency p50 %v, p90 %v, p99 %v, max %v; backlog at most %d; relay CPU %.1f µs/event\n",
		len(r.lat), r.achieved, o.perTx, o.mode, o.write, o.inProcess, r.q(0.5), r.q(0.9), r.q(0.99), r.lat[len(r.lat)-1].Round(10*time.Microsecond), r.backlog, r.cpuPerEvent())
	return nil
}

func inProcessRelay(ctx context.Context, pool *pgxpool.Pool, table outboxdriver.Table, js jetstream.JetStream, mode, prefix string) (func(), error) {
	drv := outboxpgx.New(pool, &table)
	var store outboxdriver.Source
	store, err := drv.Store()
	if err != nil {
		return nil, err
	}
	if mode == "cdc" {
		if store, err = pgcdc.ForDriver(drv, nil); err != nil {
			return nil, err
		}
	}
	pub, err := natspub.New(js, nil)
	if err != nil {
		return nil, err
	}
	r, err := relay.New(store, pub, &relay.Config{TopicTemplate: prefix + ".${aggregatetype}"})
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	return func() { _ = r.Stop(ctx); _ = pub.Close() }, nil
}

// settle flushes the backlog's writes to disk (a checkpoint) before a relay starts, so
// no relay's timing includes a checkpoint of the backlog written for it.
func settle(ctx context.Context, pool *pgxpool.Pool) {
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: checkpoint (needs pg_checkpoint):", err)
	}
}

// openStream connects to NATS and creates a stream named name over the subjects
// name.>; closeStream deletes it and disconnects.
func openStream(ctx context.Context, natsURL, name string, st jetstream.StorageType) (js jetstream.JetStream, closeStream func(), err error) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, nil, err
	}
	if js, err = jetstream.New(nc); err == nil {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: st})
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, func() { _ = js.DeleteStream(context.Background(), name); nc.Close() }, nil
}
