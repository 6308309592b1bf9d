package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/natstest"
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
	maxConns := 0
	conns := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		maxConns = max(maxConns, n)
		return n
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

	get := func(path string) string {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	metrics := get("/metrics")
	for _, tb := range []string{tA.String(), tB.String(), tC.String(), d + ".outbox"} {
		if !strings.Contains(metrics, `outbox_relay_leader{table="`+tb+`"} 1`) {
			t.Errorf("/metrics lacks the leader series of %s", tb)
		}
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
	if maxConns > 4 {
		t.Errorf("the relay used %d connections, over --max-conns 4", maxConns)
	}
	t.Logf("at most %d connections for 4 tables", maxConns)
}

// natsReadAvailable reads up to n of the scope's stored messages, waiting briefly.
func natsReadAvailable(t *testing.T, s *natsScope, n int) []broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	msgs, _ := natstest.Read(ctx, s.url, s.stream, ">", n)
	return msgs
}
