package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outbox/internal/testenv"
)

// TestBlackHoledRelay: a relay process whose every database connection goes through
// a proxy that stops forwarding (packets dropped, no reset: a black hole), in poll,
// group and CDC mode. No call waits on it past its bound: the database lets the
// cut-off relay's leadership (its lock session, its leases, its replication stream)
// go within --leader-timeout, a second process takes the table over and publishes
// what is written after the cut, and once the network heals nothing is lost and each
// aggregate is in order.
func TestBlackHoledRelay(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "group", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			blackHoled(t, mode)
		})
	}
}

func blackHoled(t *testing.T, mode string) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	cutURL, proxy := cutDatabase(t, url)
	table := modeTable(t, url, pool, mode)
	ns := newNATSScope(t)
	args := func(db, id string) []string {
		a := []string{"--db", db, "--table", table.Schema + "." + table.Name, "--broker", ns.url, "--topic-template", ns.template(),
			"--leader-timeout", "3s", "--poll-interval", "100ms"}
		switch mode {
		case "cdc":
			a = append(a, "--mode", "cdc")
		case "group":
			a = append(a, "--group", "--relay-id", id, "--partition-lease", "3s")
		}
		return a
	}
	ctx := context.Background()
	a := startRelayProc(t, nil, args(cutURL, "a")...)
	want := writeEvents(t, pool, table, 5, 100)
	testenv.WaitTell(t, ctx, "the first relay publishing", func() bool { _, n := ns.duplicates(); return n > 0 }, a.output)
	if mode != "group" {
		waitUnpublished(t, pool, table, 0, 60*time.Second) // the first relay leads the table
	}
	b := startRelayProc(t, nil, args(url, "b")...)
	proxy.Blackhole()
	cut := time.Now()
	for agg, ids := range writeEvents(t, pool, table, 5, 100) {
		want[agg] = append(want[agg], ids...)
	}
	waitUnpublished(t, pool, table, 0, 90*time.Second)
	// Measured, not asserted: the bound is the database's (--leader-timeout 3s).
	t.Logf("%s: every event written after the cut published %v after it", mode, time.Since(cut).Round(time.Millisecond))
	proxy.Heal()
	checkOrder(t, want, ns.read(t, 200))
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	<-b.done
}
