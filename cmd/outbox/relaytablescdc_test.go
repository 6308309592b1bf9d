package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/pgcdc"
)

// cdcTables makes n tables as prefixedTables does, and their shared slot and
// publication with `outbox migrate --tables --cdc`, dropped when the test ends.
func cdcTables(t *testing.T, url string, pool *pgxpool.Pool, prefix string, n int) ([]outboxdriver.Table, string) {
	t.Helper()
	testenv.LogicalReplication(t, pool)
	tables := prefixedTables(t, pool, url, prefix, n)
	slot := "outbox_outbox_test_" + prefix // .ci/run drops a test slot left behind
	t.Cleanup(func() {
		if err := testenv.DropSlot(context.Background(), pool, slot); err != nil {
			t.Error(err)
		}
	})
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", prefix+"_*.outbox", "--cdc", "--slot", slot)
	if code != 0 || !strings.Contains(stdout, fmt.Sprintf("replication slot %s ready for %d tables", slot, n)) {
		t.Fatalf("migrate --tables --cdc: %s%s", stdout, stderr)
	}
	return tables, slot
}

// TestRelayTablesCDC: `outbox relay --tables --mode cdc` reads every table from one
// slot and one publication, over one replication connection, each table in order
// per aggregate in its own write mode (rows, table-less, insert-delete); a
// table-less tenant created while it runs (its rescan an hour away) is found by its
// first event, which exists nowhere but in the WAL, and that event arrives;
// `migrate --tables --drop-cdc` retires the slot once the relay stopped.
func TestRelayTablesCDC(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	prefix := testenv.UniqueName("mc")
	tables, slot := cdcTables(t, url, pool, prefix, 3)
	pattern := prefix + "_*.outbox"
	ns := newNATSScope(t)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := startRelayProc(t, nil, "--db", url, "--tables", pattern, "--mode", "cdc", "--slot", slot, "--broker", ns.url,
		"--topic-template", ns.template(), "--tables-rescan", "1h", "--http", addr)

	want := map[string][]string{}
	tableOfID := map[string]string{}
	write := func(table outboxdriver.Table, mode outboxdriver.WriteMode, n int) {
		t.Helper()
		for agg, ids := range writeMode(t, pool, table, mode, 7, n) {
			want[table.String()+"/"+agg] = ids
			for _, id := range ids {
				tableOfID[id] = table.String()
			}
		}
	}
	modes := []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteMessage, outboxdriver.WriteInsertDelete}
	for i, table := range tables {
		write(table, modes[i], 300)
	}
	// A table-less tenant the relay has not seen: migrated, not added to the
	// publication, written to at once.
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+prefix+"_3"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+prefix+"_3 CASCADE") })
	late := migrateSchema(t, url, prefix+"_3", "outbox")
	write(late, outboxdriver.WriteMessage, 50)

	got := ns.read(t, 950)
	for i := range got {
		got[i].Key = tableOfID[got[i].ID] + "/" + got[i].Key
	}
	checkOrder(t, want, got)

	var ready string
	testenv.WaitTell(t, ctx, "/readyz with 4 tables", func() bool {
		ready = httpBody(addr, "/readyz")
		return strings.HasPrefix(ready, "ready (4 tables)")
	}, func() string { return ready + "\n" + p.output() })
	var active, own, published int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE slot_name = $1 AND active),
  count(*) FILTER (WHERE slot_name = ANY($2)) FROM pg_replication_slots`, slot,
		[]string{pgcdc.DefaultSlot(tables[0]), pgcdc.DefaultSlot(tables[1]), pgcdc.DefaultSlot(tables[2]), pgcdc.DefaultSlot(late)}).Scan(&active, &own); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1`, slot).Scan(&published); err != nil {
		t.Fatal(err)
	}
	if active != 1 || own != 0 || published != 4 {
		t.Fatalf("shared slot active: %d, slots of single tables: %d, tables in the publication: %d; want 1, 0, 4", active, own, published)
	}

	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", pattern, "--drop-cdc", "--slot", slot)
	if code != 0 || !strings.Contains(stdout, "4 tables: dropped replication slot "+slot+" and publication "+slot) {
		t.Fatalf("migrate --tables --drop-cdc: %s%s", stdout, stderr)
	}
}

// TestRelayTablesCDCKill kills a `relay --tables --mode cdc` process with SIGKILL at
// two points (after an event was read from the shared stream and before it was
// published; after the broker acknowledged a batch and before its position was
// confirmed) while producers write to three tables, table-less and rows. The next
// process publishes everything, each table in order per aggregate. What it sends
// again is not bounded by a batch here, as it is for a table alone (TestCDCKill):
// the slot's position waits for the slowest table, and a faster table skips what it
// had sent only up to its progress recorded last (once a second), so the count
// depends on timing; TestSharedSlotStuckTable checks the skipping itself.
func TestRelayTablesCDCKill(t *testing.T) {
	t.Parallel()
	for _, fp := range []string{"wal.after-receive-before-publish:1500", "relay.after-publish-before-mark:20"} {
		t.Run(strings.Split(fp, ":")[0], func(t *testing.T) {
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			prefix := testenv.UniqueName("mx")
			tables, slot := cdcTables(t, url, pool, prefix, 3)
			pattern := prefix + "_*.outbox"
			ns := newNATSScope(t)
			const n, batch = 1000, 50
			args := []string{"--db", url, "--tables", pattern, "--mode", "cdc", "--slot", slot, "--broker", ns.url,
				"--topic-template", ns.template(), "--batch-size", fmt.Sprint(batch)}
			first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=" + fp}, args...)
			want := map[string][]string{}
			tableOfID := map[string]string{}
			modes := []outboxdriver.WriteMode{outboxdriver.WriteMessage, outboxdriver.WriteRows, outboxdriver.WriteMessage}
			for i, table := range tables {
				for agg, ids := range writeMode(t, pool, table, modes[i], 7, n) {
					want[table.String()+"/"+agg] = ids
					for _, id := range ids {
						tableOfID[id] = table.String()
					}
				}
			}
			first.killedByFailpoint(t)
			second := startRelayProc(t, nil, args...)
			got := ns.read(t, 3*n)
			for i := range got {
				got[i].Key = tableOfID[got[i].ID] + "/" + got[i].Key
			}
			checkOrder(t, want, got)
			_ = second.cmd.Process.Signal(syscall.SIGTERM)
			<-second.done
			dups, distinct := ns.duplicates()
			t.Logf("%s: %d distinct, %d published again (batch %d, 3 tables)", fp, distinct, dups, batch)
		})
	}
}
