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
	const aggs, n = 40, 3000
	want := map[string][]string{}
	var mu sync.Mutex
	done := make(chan error, 1)
	go func() {
		ctx := context.Background()
		for i := 0; i < n; i += 10 {
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
			mu.Unlock()
			time.Sleep(25 * time.Millisecond) // about 7 s of writing
		}
		done <- nil
	}()

	time.Sleep(time.Second)
	_ = relays["r1"].cmd.Process.Kill() // dies: its partitions move after its lease
	time.Sleep(time.Second)
	_ = relays["r2"].cmd.Process.Signal(syscall.SIGSTOP) // paused past its lease...
	time.Sleep(4 * time.Second)
	_ = relays["r2"].cmd.Process.Signal(syscall.SIGCONT) // ...then back, a zombie until it checks
	relays["r4"] = startRelayProc(t, nil, args("r4")...)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitUnpublished(t, pool, table, 0, 60*time.Second)
	mu.Lock()
	checkOrder(t, want, ns.read(t, n))
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
