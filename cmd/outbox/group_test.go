package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// TestGroupOfRelays runs several relay processes on one table with --group while
// producers write: one is killed, one paused past its lease and resumed, one added.
// Nothing is lost, every aggregate's events reach the stream in order, and the status
// lists the relays and their partitions.
func TestGroupOfRelays(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ns := newNATSScope(t)
	args := func(id string) []string {
		return []string{"--db", url, "--table", table.Schema + "." + table.Name, "--broker", ns.url, "--topic-template", ns.template(),
			"--group", "--relay-id", id, "--partition-lease", "2s", "--batch-size", "20", "--poll-interval", "50ms"}
	}
	relays := map[string]*proc{}
	for _, id := range []string{"r1", "r2", "r3"} {
		relays[id] = startRelayProc(t, nil, args(id)...)
	}

	w, err := outbox.NewWriter(outboxpgx.New(pool, &table), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The producer writes through every phase below, each ended by what the leases
	// table shows, not by time.
	const aggs = 40
	want := map[string][]string{}
	var mu sync.Mutex
	stop, done := make(chan struct{}), make(chan error, 1)
	written := 0
	go func() {
		ctx := context.Background()
		for i := 0; ; i += 10 {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			evs := make([]outbox.Event, 0, 10)
			for j := i; j < i+10; j++ {
				evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("agg-%d", j%aggs), Type: "Step",
					Payload: []byte(fmt.Sprintf(`{"seq":%d}`, j))})
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
				done <- err
				return
			}
			mu.Lock()
			for _, ev := range evs {
				want[ev.AggregateID] = append(want[ev.AggregateID], ev.ID)
			}
			written += len(evs)
			mu.Unlock()
			time.Sleep(25 * time.Millisecond) //nolint:forbidigo // paces the producer (400 events/s) through the phases
		}
	}()

	leases := pgx.Identifier{table.Schema, table.Derived("_leases")}.Sanitize()
	phase := func(what string, ok func(owned map[string]int) bool) {
		t.Helper()
		var owned map[string]int
		testenv.WaitTell(t, context.Background(), what, func() bool {
			owned = map[string]int{}
			rows, err := pool.Query(context.Background(), `SELECT owner, count(*) FROM `+leases+` WHERE owner IS NOT NULL AND lease_until > now() GROUP BY owner`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var owner string
				var n int
				if err := rows.Scan(&owner, &n); err != nil {
					t.Fatal(err)
				}
				owned[owner] = n
			}
			return rows.Err() == nil && ok(owned)
		}, func() string { return fmt.Sprintf("partitions owned: %v", owned) })
	}
	phase("r1, r2 and r3 owning partitions", func(o map[string]int) bool { return o["r1"] > 0 && o["r2"] > 0 && o["r3"] > 0 })
	_ = relays["r1"].cmd.Process.Kill() // dies: its partitions move after its lease
	phase("r1's partitions moved to r2 and r3", func(o map[string]int) bool { return o["r1"] == 0 && o["r2"]+o["r3"] == 64 })
	_ = relays["r2"].cmd.Process.Signal(syscall.SIGSTOP) // paused past its lease...
	phase("r2's partitions moved to r3 while it is paused", func(o map[string]int) bool { return o["r2"] == 0 && o["r3"] == 64 })
	_ = relays["r2"].cmd.Process.Signal(syscall.SIGCONT) // ...then back, a zombie until it checks
	relays["r4"] = startRelayProc(t, nil, args("r4")...)
	phase("r4 owning partitions", func(o map[string]int) bool { return o["r4"] > 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitUnpublished(t, pool, table, 0, 60*time.Second)
	mu.Lock()
	checkOrder(t, want, ns.read(t, written))
	mu.Unlock()
	if testing.Verbose() {
		for id, p := range relays {
			for _, line := range strings.Split(p.output(), "\n") {
				if strings.Contains(line, "partitions") || strings.Contains(line, "lease") || strings.Contains(line, "ERROR") || strings.Contains(line, "WARN") {
					t.Logf("%s: %s", id, line)
				}
			}
		}
	}
	dups, distinct := ns.duplicates()
	t.Logf("%d distinct events, %d published more than once (handovers)", distinct, dups)
	if dups > 3*20 {
		t.Errorf("%d duplicates: more than the batches in flight at the three handovers (batch 20)", dups)
	}

	// The survivors share the partitions between them.
	var stdout string
	wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	testenv.WaitTell(t, wctx, "the partitions shared by the three live relays", func() bool {
		out, stderr, code := runCLI(t, nil, "status", "--db", url, "--table", table.Schema+"."+table.Name, "--json")
		if code != 0 {
			t.Fatal(stderr)
		}
		stdout = out
		var st struct {
			Relays []struct {
				ID         string `json:"id"`
				Partitions []int  `json:"partitions"`
			} `json:"relays"`
		}
		if err := json.Unmarshal([]byte(stdout), &st); err != nil {
			t.Fatal(err)
		}
		owned, live := 0, 0
		for _, r := range st.Relays {
			owned += len(r.Partitions)
			if len(r.Partitions) > 0 {
				live++
			}
		}
		return owned == 64 && live == 3
	}, func() string { return stdout })
	text, _, _ := runCLI(t, nil, "status", "--db", url, "--table", table.Schema+"."+table.Name)
	if !strings.Contains(text, "relays in the group") {
		t.Fatalf("status text lacks the group:\n%s", text)
	}
}
