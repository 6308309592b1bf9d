package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/pgcdc"
)

// cdcTable migrates an outbox table in a schema of the test's own with `outbox
// migrate --cdc` (publication and slot), and drops the slot when the test ends.
func cdcTable(t *testing.T, url string, pool *pgxpool.Pool) (outboxdriver.Table, string) {
	t.Helper()
	testenv.LogicalReplication(t, pool)
	schema := testenv.Schema(t, url)
	table := outboxdriver.Table{Schema: schema, Name: "outbox"}
	slot := pgcdc.DefaultSlot(table)
	t.Cleanup(func() {
		if err := testenv.DropSlot(context.Background(), pool, slot); err != nil {
			t.Error(err)
		}
	})
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", schema+".outbox", "--cdc")
	if code != 0 || !strings.Contains(stdout, "replication slot "+slot+" ready") {
		t.Fatalf("migrate --cdc: %s%s", stdout, stderr)
	}
	return table, slot
}

// modeTable is an outbox table in a schema of the test's own, made for the relay
// mode: `migrate --cdc` (publication and slot) for "cdc", a plain `migrate` otherwise.
func modeTable(t *testing.T, url string, pool *pgxpool.Pool, mode string) outboxdriver.Table {
	t.Helper()
	if mode == "cdc" {
		table, _ := cdcTable(t, url, pool)
		return table
	}
	return migrateSchema(t, url, testenv.Schema(t, url), "outbox")
}

// cutDatabase is the test database's URL through a proxy of its own, which the test
// can blackhole (skipped when the database is not on 127.0.0.1:5432).
func cutDatabase(t *testing.T, url string) (string, *testenv.Proxy) {
	t.Helper()
	proxy := testenv.NewProxy(t, "127.0.0.1:5432")
	cutURL := strings.Replace(url, "127.0.0.1:5432", proxy.Addr(), 1)
	if cutURL == url {
		t.Skipf("the database URL %s is not on 127.0.0.1:5432: no proxy in front of it", url)
	}
	return cutURL, proxy
}

// writeMode writes n events over aggs aggregates in transactions of 10 with the given
// write mode, and returns the ids per aggregate in write order.
func writeMode(t *testing.T, pool *pgxpool.Pool, table outboxdriver.Table, mode outboxdriver.WriteMode, aggs, n int) map[string][]string {
	t.Helper()
	table.Write = mode
	return writeEvents(t, pool, table, aggs, n)
}

// TestCDCKill kills a CDC relay with SIGKILL at two points: after an event was read
// from the WAL and before it was published, and after the broker acknowledged a
// batch and before the position was confirmed. Producers write (table-less) while it
// dies; the next relay publishes everything, in order per aggregate.
func TestCDCKill(t *testing.T) {
	t.Parallel()
	for _, fp := range []string{"wal.after-receive-before-publish:1500", "relay.after-publish-before-mark:20"} {
		t.Run(strings.Split(fp, ":")[0], func(t *testing.T) {
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			table, _ := cdcTable(t, url, pool)
			ns := newNATSScope(t)
			const n, batch = 3000, 50
			args := []string{"--db", url, "--table", table.Schema + ".outbox", "--broker", ns.url, "--mode", "cdc",
				"--topic-template", ns.template(), "--batch-size", fmt.Sprint(batch)}
			first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=" + fp}, args...)
			want := writeMode(t, pool, table, outboxdriver.WriteMessage, 7, n)
			first.killedByFailpoint(t)
			second := startRelayProc(t, nil, args...)
			checkOrder(t, want, ns.read(t, n))
			_ = second.cmd.Process.Signal(syscall.SIGTERM)
			<-second.done
			dups, distinct := ns.duplicates()
			t.Logf("%s: %d distinct, %d published again (batch %d)", fp, distinct, dups, batch)
			if dups > 2*batch {
				t.Errorf("%d duplicates: more than the batch in flight and the one before", dups)
			}
		})
	}
}

// TestCDCStatusAndLostSlot: `outbox status` shows the slot; a dropped slot stops the
// relay with a clear error, and --recreate-slot recovers the rows still in the table.
func TestCDCStatusAndLostSlot(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table, slot := cdcTable(t, url, pool)
	ns := newNATSScope(t)
	args := []string{"--db", url, "--table", table.Schema + ".outbox", "--broker", ns.url, "--mode", "cdc", "--topic-template", ns.template()}
	relay := startRelayProc(t, nil, args...)
	want := writeMode(t, pool, table, outboxdriver.WriteRows, 3, 100)
	checkOrder(t, want, ns.read(t, 100))

	var st struct {
		Unpublished   int64 `json:"unpublished"`
		PublishedKept int64 `json:"published_kept"`
		Slots         []struct {
			Name       string `json:"name"`
			Exists     bool   `json:"exists"`
			Active     bool   `json:"active"`
			Backfilled bool   `json:"backfilled"`
		} `json:"cdc_slots"`
	}
	var stdout string
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testenv.WaitTell(t, wctx, "status to show the slot backfilled", func() bool {
		out, stderr, code := runCLI(t, nil, "status", "--db", url, "--table", table.Schema+".outbox", "--json")
		if code != 0 {
			t.Fatal(stderr)
		}
		stdout = out
		if err := json.Unmarshal([]byte(stdout), &st); err != nil {
			t.Fatal(err)
		}
		return len(st.Slots) == 1 && st.Slots[0].Backfilled
	}, func() string { return stdout })
	if len(st.Slots) != 1 || st.Slots[0].Name != slot || !st.Slots[0].Exists || !st.Slots[0].Active || !st.Slots[0].Backfilled {
		t.Fatalf("status: %s", stdout)
	}
	// The relayed rows are marked in the table: status counts them as published, and
	// cleanup deletes them (the relay marks a batch shortly after its acknowledgement).
	testenv.WaitTell(t, wctx, "status to count the 100 relayed rows as published", func() bool {
		stdout, _, _ = runCLI(t, nil, "status", "--db", url, "--table", table.Schema+".outbox", "--json")
		if err := json.Unmarshal([]byte(stdout), &st); err != nil {
			t.Fatal(err)
		}
		return st.Unpublished == 0 && st.PublishedKept == 100
	}, func() string { return stdout })
	out, stderr, code := runCLI(t, nil, "cleanup", "--db", url, "--table", table.Schema+".outbox", "--older-than", "1ns")
	if code != 0 || !strings.Contains(out, "deleted 100 ") {
		t.Fatalf("cleanup after a CDC relay: exit %d, %s%s", code, out, stderr)
	}

	_ = relay.cmd.Process.Signal(syscall.SIGTERM)
	<-relay.done
	ctx := context.Background()
	// The stopped relay's walsender may still be ending: retry while the slot is active.
	var dropErr error
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
	defer dcancel()
	testenv.WaitTell(t, dctx, "the slot dropped", func() bool {
		_, dropErr = pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		return dropErr == nil
	}, func() string { return fmt.Sprint(dropErr) })
	// Rows written while the slot was gone: only the table has them.
	more := writeMode(t, pool, table, outboxdriver.WriteRows, 3, 30)
	stdout, _, _ = runCLI(t, nil, "status", "--db", url, "--table", table.Schema+".outbox")
	if !strings.Contains(stdout, "LOST") {
		t.Fatalf("status does not say the slot is lost:\n%s", stdout)
	}
	_, stderr, code = runCLI(t, nil, append([]string{"relay", "--http="}, args...)...)
	if code == 0 || !strings.Contains(stderr, "replication slot lost") || !strings.Contains(stderr, "--recreate-slot") {
		t.Fatalf("relay on a lost slot: exit %d, %s", code, stderr)
	}
	recovered := startRelayProc(t, nil, append(args, "--recreate-slot")...)
	// Every row still in the table is published again (the 100 old ones are dropped
	// by JetStream's dedup), the 30 new ones for the first time.
	got := ns.read(t, 100+30)
	seen := map[string]bool{}
	for _, m := range got {
		seen[m.ID] = true
	}
	for _, ids := range more {
		for _, id := range ids {
			if !seen[id] {
				t.Fatalf("event %s written while the slot was lost was not recovered", id)
			}
		}
	}
	_ = recovered.cmd.Process.Signal(syscall.SIGTERM)
	<-recovered.done
}

// TestRetireCDCRelay runs docs/operations.md's "Retiring a CDC relay" as written: stop
// the CDC relay, `migrate --drop-cdc` (refused while it streams), and a polling relay
// on the table publishes only what the CDC relay had not: nothing is sent twice.
func TestRetireCDCRelay(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table, slot := cdcTable(t, url, pool)
	ns := newNATSScope(t)
	args := []string{"--db", url, "--table", table.Schema + ".outbox", "--broker", ns.url, "--topic-template", ns.template()}
	cdc := startRelayProc(t, nil, append(args, "--mode", "cdc")...)
	want := writeMode(t, pool, table, outboxdriver.WriteRows, 3, 60)
	ns.read(t, 60)
	waitUnpublished(t, pool, table, 0, 30*time.Second) // the CDC relay marks what it published
	if _, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", table.Schema+".outbox", "--drop-cdc"); code == 0 ||
		!strings.Contains(stderr, "stop every CDC relay of the table first") {
		t.Fatalf("migrate --drop-cdc while the relay streams: exit %d, %s", code, stderr)
	}
	_ = cdc.cmd.Process.Signal(syscall.SIGTERM)
	<-cdc.done

	ctx := context.Background()
	var out string
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	testenv.WaitTell(t, dctx, "the slot dropped", func() bool { // its walsender may still be ending
		stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", table.Schema+".outbox", "--drop-cdc")
		out = stdout + stderr
		if code != 0 && !strings.Contains(stderr, "stop every CDC relay") {
			t.Fatalf("migrate --drop-cdc: exit %d, %s", code, out)
		}
		return code == 0
	}, func() string { return out })
	if !strings.Contains(out, "dropped replication slot "+slot+" and publication "+slot) {
		t.Fatalf("migrate --drop-cdc: %s", out)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1) + (SELECT count(*) FROM pg_publication WHERE pubname = $1)`, slot).Scan(&left); err != nil || left != 0 {
		t.Fatalf("after --drop-cdc: %d of the slot and publication left (%v)", left, err)
	}
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", table.Schema+".outbox", "--drop-cdc")
	if code != 0 || !strings.Contains(stdout, "dropped nothing") {
		t.Fatalf("migrate --drop-cdc again: exit %d, %s%s", code, stdout, stderr)
	}
	stdout, stderr, code = runCLI(t, nil, "status", "--db", url, "--table", table.Schema+".outbox")
	if code != 0 || strings.Contains(stdout, "LOST") || !strings.Contains(stdout, "unpublished:") {
		t.Fatalf("status of a retired CDC table: exit %d\n%s%s", code, stdout, stderr)
	}

	poll := startRelayProc(t, nil, args...)
	more := writeMode(t, pool, table, outboxdriver.WriteRows, 3, 30)
	for agg, ids := range more {
		want[agg] = append(want[agg], ids...)
	}
	checkOrder(t, want, ns.read(t, 90))
	waitUnpublished(t, pool, table, 0, 30*time.Second)
	_ = poll.cmd.Process.Signal(syscall.SIGTERM)
	<-poll.done
	if dups, distinct := ns.duplicates(); dups != 0 || distinct != 90 {
		t.Fatalf("after the move to polling: %d distinct, %d sent again; want 90 and none", distinct, dups)
	}
}
