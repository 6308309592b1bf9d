// Package polyglot_test checks, end to end, that producers in other languages write
// events the relay publishes like the Go writer's: a Python producer (psycopg2) and a
// Node.js producer (pg) inserting the five Debezium columns, relayed in poll mode, and
// the Python producer emitting table-less logical messages, relayed in CDC mode.
// .ci/run installs python3-psycopg2 and the node packages; a laptop without them skips.
package polyglot_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const events = 20

func TestProducers(t *testing.T) {
	for _, tc := range []struct {
		name, mode string // mode: the relay's (poll or cdc)
		write      outboxdriver.WriteMode
		cmd        func(t *testing.T, dsn, table string) *exec.Cmd
	}{
		{"python rows", "poll", outboxdriver.WriteRows, func(t *testing.T, dsn, table string) *exec.Cmd {
			return exec.Command(python(t), "python/producer.py", dsn, table, "rows", fmt.Sprint(events))
		}},
		{"python table-less messages", "cdc", outboxdriver.WriteMessage, func(t *testing.T, dsn, table string) *exec.Cmd {
			return exec.Command(python(t), "python/producer.py", dsn, table, "message", fmt.Sprint(events))
		}},
		{"node rows", "poll", outboxdriver.WriteRows, func(t *testing.T, dsn, table string) *exec.Cmd {
			return exec.Command(node(t), "node/producer.js", dsn, table, fmt.Sprint(events))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			table := outboxdriver.Table{Schema: testenv.Schema(t, url), Write: tc.write}
			drv := outboxpgx.New(pool, &table)
			m, _ := drv.Migrator()
			if _, err := m.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			var src outboxdriver.Source
			if tc.mode == "cdc" {
				testenv.LogicalReplication(t, pool)
				cdc, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: testenv.QuietLogger(), StatusInterval: 100 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				// The slot first: table-less events exist only in the WAL.
				if err := cdc.Init(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = testenv.DropSlot(context.Background(), pool, cdc.Slot()) })
				src = cdc
			} else {
				src, _ = drv.Store()
			}
			cmd := tc.cmd(t, url, table.Schema+".outbox")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", tc.name, err, out)
			}
			b := memory.New(0)
			relaytest.Start(t, src, b, &relay.Config{})
			got, err := b.Wait(ctx, "", events)
			if err != nil {
				t.Fatal(err)
			}
			// Every event published once, in write order per aggregate, payload intact.
			last := map[string]int{}
			for _, msg := range got {
				var p struct{ N int }
				if err := json.Unmarshal(msg.Payload, &p); err != nil || msg.EventType != "OrderPlaced" {
					t.Fatalf("message %+v: %v", msg, err)
				}
				if prev, ok := last[msg.Key]; ok && p.N <= prev {
					t.Fatalf("aggregate %s: event %d after %d", msg.Key, p.N, prev)
				}
				last[msg.Key] = p.N
			}
			if len(got) != events || len(last) != 3 {
				t.Fatalf("%d messages over %d aggregates, want %d over 3", len(got), len(last), events)
			}
		})
	}
}

// python is Debian's Python with psycopg2 (the package python3-psycopg2).
func python(t *testing.T) string {
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import psycopg2").Run(); err != nil {
		testenv.Missing(t, "%s with psycopg2 (apt-get install python3-psycopg2): %v", py, err)
	}
	return py
}

// node is Node.js with the pg package installed (npm ci in node/).
func node(t *testing.T) string {
	n, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join("node", "node_modules", "pg"))
	}
	if err != nil {
		testenv.Missing(t, "node with the pg package (cd examples/polyglot/node && npm ci): %v", err)
	}
	return n
}
