package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outbox/internal/testenv"
)

// TestPausedLeader (issue #20): the active relay process is paused with SIGSTOP past
// its --leader-timeout while producers write, in poll and CDC mode. The database ends
// the paused relay's sessions, the standby takes over and publishes; the paused one,
// resumed, drops what it held. Nothing is lost and every aggregate's first deliveries
// reach the stream in write order.
func TestPausedLeader(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			table := modeTable(t, url, pool, mode)
			ns := newNATSScope(t)
			args := []string{"--db", url, "--table", table.Schema + "." + table.Name, "--broker", ns.url, "--mode", mode,
				"--topic-template", ns.template(), "--batch-size", "20", "--poll-interval", "50ms", "--leader-timeout", "2s"}
			first := startRelayProc(t, nil, args...)
			const aggs, n = 8, 800
			want := map[string][]string{}
			add := func(ids map[string][]string) {
				for agg, l := range ids {
					want[agg] = append(want[agg], l...)
				}
			}
			add(writeEvents(t, pool, table, aggs, n/4))
			ns.read(t, n/4) // the first relay is active and has published
			second := startRelayProc(t, nil, args...)
			testenv.WaitTell(t, t.Context(), "the second relay standing by", func() bool { return strings.Contains(second.output(), "relay: standby") }, second.output)
			_ = first.cmd.Process.Signal(syscall.SIGSTOP)
			paused := time.Now()
			add(writeEvents(t, pool, table, aggs, n/4)) // while the leader is paused
			ns.read(t, n/2)                             // published by the standby, the leader still paused
			t.Logf("%s: the standby published the events written during the pause %v after it began (bound 2 s)",
				mode, time.Since(paused).Round(time.Millisecond))
			_ = first.cmd.Process.Signal(syscall.SIGCONT) // the zombie wakes up, its term long over (the standby published)
			add(writeEvents(t, pool, table, aggs, n/2))
			checkOrder(t, want, ns.read(t, n))
			for _, p := range []*proc{first, second} {
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				<-p.done
			}
			dups, distinct := ns.duplicates()
			t.Logf("%s: %d distinct events, %d published more than once", mode, distinct, dups)
		})
	}
}
