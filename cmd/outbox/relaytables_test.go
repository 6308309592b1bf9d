package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// TestRelayTables: one `outbox relay --tables` process relays every table its
// patterns match, each in order per aggregate, within --max-conns connections
// however many tables; a table created while it runs is found and relayed, a table
// dropped is let go; its metrics and /readyz name each table.
func TestRelayTables(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	// Schemas of this test's own prefix: a pattern over the test database must not
	// reach another test's tables.
	prefix := testenv.UniqueName("mt")
	schema := func(suffix string) string {
		t.Helper()
		name := prefix + "_" + suffix
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+name+" CASCADE") })
		return name
	}
	a, b, c := schema("a"), schema("b"), schema("c")
	if _, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", a+".outbox,"+b+".outbox,"+c+".events"); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	nats := newNATSScope(t)
	app := prefix + "_relay" // names the relay's sessions in pg_stat_activity
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := startRelayProc(t, nil, "--db", url+"&application_name="+app, "--broker", nats.url, "--topic-template", nats.template(),
		"--tables", prefix+"_*.outbox,"+c+".events", "--tables-rescan", "1s", "--max-conns", "4", "--http", addr)

	want := map[string][]string{}
	write := func(table outboxdriver.Table, n int) {
		t.Helper()
		w, err := outbox.NewWriter(outboxpgx.New(pool, &table), nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i += 10 {
			evs := make([]outbox.Event, 0, 10)
			for j := i; j < i+10 && j < n; j++ {
				evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("%s-%d", table, j%7), Type: "Step", Payload: []byte(fmt.Sprintf(`{"n":%d}`, j))})
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				want[ev.AggregateID] = append(want[ev.AggregateID], ev.ID)
			}
		}
	}
	// The connections the relay's pool holds, as its /metrics says: what --max-conns
	// caps. (The server's own count, pg_stat_activity, may for a moment also show a
	// connection the pool let go while its backend has not yet exited.)
	maxConns, maxServer, samples := 0, 0, 0
	poolConns := regexp.MustCompile(`(?m)^outbox_db_pool_connections (\d+)$`)
	conns := func() {
		if m := poolConns.FindStringSubmatch(httpBody(addr, "/metrics")); m != nil { // nil: not serving yet
			n, _ := strconv.Atoi(m[1])
			maxConns, samples = max(maxConns, n), samples+1
		}
		var s int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&s); err != nil {
			t.Fatal(err)
		}
		maxServer = max(maxServer, s)
	}
	tA, tB, tC := outboxdriver.Table{Schema: a, Name: "outbox"}, outboxdriver.Table{Schema: b, Name: "outbox"}, outboxdriver.Table{Schema: c, Name: "events"}
	for range 5 {
		write(tA, 60)
		write(tB, 60)
		write(tC, 60)
		conns()
	}
	// arrived waits for n events on NATS and checks each aggregate's order.
	arrived := func(n int) {
		t.Helper()
		var got []broker.Message
		testenv.WaitTell(t, ctx, fmt.Sprintf("%d events on NATS", n), func() bool {
			conns()
			got = natsReadAvailable(t, nats, n)
			return len(got) >= n
		}, p.output)
		checkOrder(t, want, got)
	}
	arrived(900)

	// A table created while it runs, matching the pattern, is relayed.
	d := schema("d")
	if _, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", d+".outbox"); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	write(outboxdriver.Table{Schema: d, Name: "outbox"}, 50)
	arrived(950)

	get := func(path string) string { return httpBody(addr, path) }
	metrics := get("/metrics")
	for _, tb := range []string{tA.String(), tB.String(), tC.String(), d + ".outbox"} {
		if !strings.Contains(metrics, `outbox_relay_leader{table="`+tb+`"} 1`) {
			t.Errorf("/metrics lacks the leader series of %s", tb)
		}
	}
	// The dashboard lists every table, each linked to its own pages.
	ui := get("/ui/")
	for _, tb := range []string{tA.String(), tB.String(), tC.String(), d + ".outbox"} {
		if !strings.Contains(ui, `data-table="`+tb+`"`) {
			t.Errorf("the dashboard does not list %s:\n%s", tb, ui)
		}
	}
	if page := get("/ui/t/" + tA.String() + "/"); !strings.Contains(page, `id="relay-role">active<`) {
		t.Errorf("the dashboard of %s:\n%s", tA, page)
	}
	if page := get("/ui/t/" + tA.String() + "/replay"); strings.Contains(page, `id="replay-unavailable"`) || !strings.Contains(page, "Replay history") {
		t.Errorf("the replay page of %s, through the relay's publisher:\n%s", tA, page)
	}
	// A table dropped is let go: /readyz lists the others.
	if _, err := pool.Exec(ctx, "DROP SCHEMA "+b+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	var ready string
	testenv.WaitTell(t, ctx, "/readyz without the dropped table", func() bool {
		ready = get("/readyz")
		return strings.HasPrefix(ready, "ready (3 tables)") && !strings.Contains(ready, b+".outbox")
	}, func() string { return ready + "\n" + p.output() })
	// ... and said to be let go on purpose, so the alerts do not page for it.
	if metrics := get("/metrics"); !strings.Contains(metrics, `outbox_relay_table_retired{table="`+tB.String()+`"} 1`) {
		t.Errorf("/metrics does not say %s was let go:\n%s", tB, metrics)
	}
	if samples == 0 {
		t.Error("/metrics never said outbox_db_pool_connections")
	}
	if maxConns > 4 {
		t.Errorf("the relay used %d connections, over --max-conns 4", maxConns)
	}
	t.Logf("at most %d connections in the pool for 4 tables (%d seen by the server)", maxConns, maxServer)
}

// natsReadAvailable reads up to n of the scope's stored messages, waiting briefly.
func natsReadAvailable(t *testing.T, s *natsScope, n int) []broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	msgs, _ := natstest.Read(ctx, s.url, s.stream, ">", n)
	return msgs
}

// TestRelayTablesKillMidBatch: a --tables relay killed with SIGKILL after the broker
// acknowledged a batch and before it was marked loses nothing in any table; the next
// relay publishes again at most the batches then in flight, one per table, and every
// table keeps its order per aggregate.
func TestRelayTablesKillMidBatch(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	prefix := testenv.UniqueName("mk")
	tables := prefixedTables(t, pool, url, prefix, 3)
	want := map[string][]string{}
	for _, table := range tables {
		// Aggregate ids of the table's own, so that order is checked per table.
		for agg, ids := range writeEvents(t, pool, table, 7, 300) {
			want[table.String()+"/"+agg] = ids
		}
	}
	ns := newNATSScope(t)
	const batch = 50
	args := []string{"--db", url, "--tables", prefix + "_*.outbox", "--broker", ns.url,
		"--topic-template", ns.template(), "--batch-size", fmt.Sprint(batch)}
	first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=relay.after-publish-before-mark:4"}, args...)
	first.killedByFailpoint(t)
	second := startRelayProc(t, nil, args...)
	for _, table := range tables {
		waitUnpublished(t, pool, table, 0, 60*time.Second)
	}
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	<-second.done

	// Keys are aggregate ids, the same in every table: order is checked per table,
	// each message keyed by the table that holds its row.
	got := ns.read(t, 900)
	for i := range got {
		got[i].Key = tableOf(t, pool, tables, got[i].ID) + "/" + got[i].Key
	}
	checkOrder(t, want, got)
	var dups, distinct int
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testenv.Wait(t, wctx, "every id on the subscription", func() bool {
		dups, distinct = ns.duplicates()
		return distinct >= 900
	})
	if distinct != 900 || dups > len(tables)*batch {
		t.Fatalf("%d distinct events published with %d duplicates; want 900 and at most one batch per table (%d)", distinct, dups, len(tables)*batch)
	}
	t.Logf("kill after publish, before mark, 3 tables: %d duplicates", dups)
}

// tableOf names the table that holds event id.
func tableOf(t *testing.T, pool *pgxpool.Pool, tables []outboxdriver.Table, id string) string {
	t.Helper()
	for _, table := range tables {
		var n int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+" WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return table.String()
		}
	}
	t.Fatalf("event %s is in no table", id)
	return ""
}

// TestRelayTablesGroup: three --tables processes in --group mode share the partitions
// of two tables (each table's partitions leased among them, as a group of that table
// alone would) while producers write to both; one is killed. Nothing is lost and
// each table keeps its order per aggregate.
func TestRelayTablesGroup(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	prefix := testenv.UniqueName("mg")
	tables := prefixedTables(t, pool, url, prefix, 2)
	ns := newNATSScope(t)
	args := func(id string) []string {
		return []string{"--db", url, "--tables", prefix + "_*.outbox", "--broker", ns.url, "--topic-template", ns.template(),
			"--group", "--relay-id", id, "--partition-lease", "2s", "--batch-size", "20", "--poll-interval", "200ms"}
	}
	relays := map[string]*proc{}
	for _, id := range []string{"r1", "r2", "r3"} {
		relays[id] = startRelayProc(t, nil, args(id)...)
	}
	want := map[string][]string{}
	writers := make([]*outbox.Writer[pgx.Tx], len(tables))
	for i := range tables {
		w, err := outbox.NewWriter(outboxpgx.New(pool, &tables[i]), nil)
		if err != nil {
			t.Fatal(err)
		}
		writers[i] = w
	}
	const n = 1200
	for i := 0; i < n; i += 10 {
		k := (i / 10) % len(tables)
		evs := make([]outbox.Event, 0, 10)
		for j := i; j < i+10; j++ {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("%s-agg-%d", tables[k].Schema, j%20), Type: "Step",
				Payload: []byte(fmt.Sprintf(`{"seq":%d}`, j))})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writers[k].WriteTx(ctx, tx, evs...) }); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			want[ev.AggregateID] = append(want[ev.AggregateID], ev.ID)
		}
		if i == n/3 {
			_ = relays["r1"].cmd.Process.Kill() // its partitions of both tables move after its lease
		}
		time.Sleep(10 * time.Millisecond) //nolint:forbidigo // paces the producer, so that its writes span the kill and the lease's end
	}
	for _, table := range tables {
		waitUnpublished(t, pool, table, 0, 60*time.Second)
	}
	checkOrder(t, want, ns.read(t, n))
	// Each table's partitions were leased by the group's members.
	for _, table := range tables {
		var owners int
		if err := pool.QueryRow(ctx, "SELECT count(DISTINCT owner) FROM "+pgx.Identifier{table.Schema, table.Name + "_leases"}.Sanitize()).Scan(&owners); err != nil {
			t.Fatal(err)
		}
		if owners < 2 {
			t.Errorf("%s: its partitions are leased by %d relays, want the group's", table, owners)
		}
	}
}

// TestRelayTablesRouters: with --tables, a router is each table's own: CloudEvents
// name the event's table in their source, and Debezium's router reads each table's
// own extra columns.
func TestRelayTablesRouters(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	prefix := testenv.UniqueName("mr")
	tables := prefixedTables(t, pool, url, prefix, 2)
	p := startRelayProc(t, nil, "--db", url, "--tables", prefix+"_*.outbox", "--broker", "stdout:", "--log-level", "error",
		"--format", "cloudevents", "--cloudevents-mode", "structured")
	for _, table := range tables {
		writeEvents(t, pool, table, 2, 10)
	}
	for _, table := range tables {
		waitUnpublished(t, pool, table, 0, 30*time.Second)
	}
	// A row is marked once the broker took its event; the line may still be on its
	// way through the pipe: wait for the lines, then count them.
	out := waitLines(t, p, len(tables)*10)
	for _, table := range tables {
		if n := strings.Count(out, `"source":"/outbox/`+table.String()+`"`); n != 10 {
			t.Errorf("%s: %d events with its source, want 10:\n%s", table, n, out)
		}
	}

	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done

	// Debezium's router, placing a column each table has (with its own default) in a
	// header.
	for i, table := range tables {
		if _, err := pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN tenant text NOT NULL DEFAULT 'tenant-%d'",
			pgx.Identifier{table.Schema, table.Name}.Sanitize(), i)); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(t.TempDir(), "router.properties")
	if err := os.WriteFile(config, []byte("table.fields.additional.placement=tenant:header\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p = startRelayProc(t, nil, "--db", url, "--tables", prefix+"_*.outbox", "--broker", "stdout:", "--log-level", "error", "--config", config)
	for _, table := range tables {
		writeEvents(t, pool, table, 2, 10)
	}
	for _, table := range tables {
		waitUnpublished(t, pool, table, 0, 30*time.Second)
	}
	out = waitLines(t, p, len(tables)*10)
	for i := range tables {
		if n := strings.Count(out, fmt.Sprintf(`"tenant":"tenant-%d"`, i)); n != 10 {
			t.Errorf("tenant-%d: %d events with its header, want 10:\n%s", i, n, out)
		}
	}
}

// waitLines waits until the process printed at least n events (lines starting with
// "{"), and returns its output.
func waitLines(t *testing.T, p *proc, n int) string {
	t.Helper()
	var out string
	testenv.WaitTell(t, context.Background(), fmt.Sprintf("%d events on the relay's output", n), func() bool {
		out = p.output()
		return strings.Count("\n"+out, "\n{") >= n
	}, func() string { return out })
	return out
}

// prefixedTables makes n schemas, prefix_0 to prefix_<n-1>, each with a migrated
// outbox table, dropped when the test ends: a pattern over them reaches no other
// test's tables.
func prefixedTables(t *testing.T, pool *pgxpool.Pool, url, prefix string, n int) []outboxdriver.Table {
	t.Helper()
	var tables []outboxdriver.Table
	for i := range n {
		schema := fmt.Sprintf("%s_%d", prefix, i)
		if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
		tables = append(tables, migrateSchema(t, url, schema, "outbox"))
	}
	return tables
}

// TestRelayTablesDroppedTable: a table dropped while the relay runs is let go at once,
// not at the next rescan (an hour here): the one statement asking which tables have
// work notices it, still wakes the other tables, and asks for a rescan.
func TestRelayTablesDroppedTable(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	prefix := testenv.UniqueName("md")
	tables := prefixedTables(t, pool, url, prefix, 2)
	ns := newNATSScope(t)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := startRelayProc(t, nil, "--db", url, "--tables", prefix+"_*.outbox", "--broker", ns.url,
		"--topic-template", ns.template(), "--tables-rescan", "1h", "--http", addr)
	ready := func() string { return httpBody(addr, "/readyz") }
	ctx := context.Background()
	var got string
	testenv.WaitTell(t, ctx, "both tables relayed", func() bool {
		got = ready()
		return strings.HasPrefix(got, "ready (2 tables)")
	}, func() string { return got + "\n" + p.output() })
	if _, err := pool.Exec(ctx, "DROP TABLE "+tables[1].Schema+".outbox"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitTell(t, ctx, "the dropped table let go before the next rescan", func() bool {
		got = ready()
		return strings.HasPrefix(got, "ready (1 table)") && !strings.Contains(got, tables[1].String())
	}, func() string { return got + "\n" + p.output() })
	want := writeEvents(t, pool, tables[0], 3, 30)
	checkOrder(t, want, ns.read(t, 30))
}

// TestRelayTablesPartitioned: the active --tables process is cut off from PostgreSQL
// (its connections blackholed: nothing forwarded, nothing closed) while producers write
// to three tables. The standby process takes over every table once the database ends
// the silent sessions (--leader-timeout), and after healing nothing is lost and each
// table keeps its order per aggregate on first delivery. In both relay modes.
func TestRelayTablesPartitioned(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			relayTablesPartitioned(t, mode)
		})
	}
}

// relayTablesPartitioned is TestRelayTablesPartitioned in one relay mode; in CDC
// mode both processes read from one shared slot, which the database frees when the
// cut-off process's stream stays silent past --leader-timeout.
func relayTablesPartitioned(t *testing.T, mode string) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	prefix := testenv.UniqueName("mp")
	var tables []outboxdriver.Table
	extra := []string{"--mode", mode}
	if mode == "cdc" {
		var slot string
		tables, slot = cdcTables(t, url, pool, prefix, 3)
		extra = append(extra, "--slot", slot)
	} else {
		tables = prefixedTables(t, pool, url, prefix, 3)
	}
	ns := newNATSScope(t)
	cutURL, proxy := cutDatabase(t, url)
	args := func(db, addr string) []string {
		return append([]string{"--db", db, "--tables", prefix + "_*.outbox", "--broker", ns.url, "--topic-template", ns.template(),
			"--leader-timeout", "3s", "--http", addr}, extra...)
	}
	addrA, addrB := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	ready := func(addr string) string { return httpBody(addr, "/readyz") }
	a := startRelayProc(t, nil, args(cutURL, addrA)...)
	var got string
	testenv.WaitTell(t, ctx, "the first process active on every table", func() bool {
		got = ready(addrA)
		return strings.Count(got, " active") == 3
	}, func() string { return got + "\n" + a.output() })
	b := startRelayProc(t, nil, args(url, addrB)...)
	testenv.WaitTell(t, ctx, "the second process standing by on every table", func() bool {
		got = ready(addrB)
		return strings.Count(got, " standby") == 3
	}, func() string { return got + "\n" + b.output() })

	want := map[string][]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, table := range tables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				ids := writeEvents(t, pool, table, 5, 40)
				mu.Lock()
				for agg, evs := range ids {
					want[table.String()+"/"+agg] = append(want[table.String()+"/"+agg], evs...)
				}
				mu.Unlock()
				time.Sleep(200 * time.Millisecond) //nolint:forbidigo // paces the producers, so that their writes outlast the cut
			}
		}()
	}
	testenv.Wait(t, ctx, "the first process publishing", func() bool { _, n := ns.duplicates(); return n > 0 })
	proxy.Blackhole()
	cut := time.Now()
	testenv.WaitTell(t, ctx, "the standby active on every table after the cut", func() bool {
		got = ready(addrB)
		return strings.Count(got, " active") == 3
	}, func() string { return got + "\n" + b.output() })
	t.Logf("%s: the standby led every table %v after the cut (--leader-timeout 3s)", mode, time.Since(cut).Round(time.Millisecond))
	wg.Wait()
	for _, table := range tables {
		waitUnpublished(t, pool, table, 0, 60*time.Second)
	}
	proxy.Heal()
	msgs := ns.read(t, 600)
	for i := range msgs {
		msgs[i].Key = tableOf(t, pool, tables, msgs[i].ID) + "/" + msgs[i].Key
	}
	checkOrder(t, want, msgs)
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	<-b.done
}

// httpBody is the body a relay's HTTP endpoint answers at path, or the error that
// kept it from answering (within 2 s).
func httpBody(addr, path string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}
