package relay_test

import (
	"testing"
	"time"

	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

// TestPartitionedLeader (issue #20): the active relay's connections to PostgreSQL are
// blackholed (nothing forwarded, nothing closed: the worst half-open case, and what
// PostgreSQL sees of a paused process) while producers write. With the default
// LeaderTimeout (10 s) the database ends the silent leader's session, the standby
// publishes within 15 s, and after healing the old leader breaks no first-delivery
// order; nothing is lost.
func TestPartitionedLeader(t *testing.T) {
	e := setup(t)
	url := testenv.DatabaseURL(t)
	poolA, proxy := testenv.ProxiedPool(t, url)
	storeA, _ := outboxpgx.New(poolA, &e.table).Store()

	mem := memory.New(0)
	pubA, pubB := &testenv.Counted{Publisher: mem}, &testenv.Counted{Publisher: mem}
	a := relaytest.Start(t, storeA, pubA, &relay.Config{PollInterval: 50 * time.Millisecond})
	ctx := waitCtx(t)
	testenv.Wait(t, ctx, "the first relay to lead", func() bool { return a.Stats().Leader })
	b := relaytest.Start(t, e.store, pubB, &relay.Config{PollInterval: 50 * time.Millisecond})

	produced := make(chan map[string][]string, 1)
	go func() { produced <- produce(t, e, 8, 150) }()
	testenv.Wait(t, ctx, "the leader publishing", func() bool { return pubA.N.Load() > 0 })
	proxy.Blackhole()
	cut := time.Now()
	var stepped time.Duration // when the cut-off relay stopped believing it leads
	testenv.Wait(t, ctx, "the standby publishing after the leader was cut off", func() bool {
		if stepped == 0 && !a.Stats().Leader {
			stepped = time.Since(cut)
		}
		return pubB.N.Load() > 0
	})
	// How long it took is measured, not asserted (the bound is the database's
	// LeaderTimeout; relay/doc.go records the takeover times).
	t.Logf("the cut-off relay stepped down %v and the standby took over %v after the cut (LeaderTimeout %v)",
		stepped.Round(time.Millisecond), time.Since(cut).Round(time.Millisecond), relay.LeaderTimeoutDefault)
	if !b.Stats().Leader {
		t.Fatal("the standby publishes but is not the leader")
	}
	// It steps down by its own clock, when its last heartbeat's validity ends, before
	// the database lets the standby in: never two relays that believe they lead.
	if stepped == 0 {
		t.Fatal("the cut-off relay still believed it led when the standby took over")
	}
	aBefore := pubA.N.Load()
	proxy.Heal()
	deliveredInOrder(t, mem, <-produced)
	t.Logf("old leader sent %d messages before the cut, %d more after healing (duplicates dropped: %d)",
		aBefore, pubA.N.Load()-aBefore, mem.Duplicates())
}

// TestPartitionedGroupMember (issue #20, group mode): one of two group members is cut
// off from PostgreSQL (blackholed) while producers write; the other takes its
// partitions after the lease (2 s) and publishes them; after healing nothing is lost
// and no first delivery is out of order.
func TestPartitionedGroupMember(t *testing.T) {
	e := setup(t)
	poolA, proxy := testenv.ProxiedPool(t, testenv.DatabaseURL(t))
	storeA, _ := outboxpgx.New(poolA, &e.table).Store()
	mem := memory.New(0)
	pubA, pubB := &testenv.Counted{Publisher: mem}, &testenv.Counted{Publisher: mem}
	const lease = 2 * time.Second
	cfg := func(id string) *relay.Config {
		return &relay.Config{PollInterval: 50 * time.Millisecond, Group: &relay.GroupConfig{RelayID: id, LeaseTTL: lease}}
	}
	a := relaytest.Start(t, storeA, pubA, cfg("a"))
	b := relaytest.Start(t, e.store, pubB, cfg("b"))
	ctx := waitCtx(t)
	testenv.Wait(t, ctx, "both members owning partitions", func() bool {
		return a.Stats().Partitions > 0 && b.Stats().Partitions > 0 && a.Stats().Partitions+b.Stats().Partitions >= 64
	})
	produced := make(chan map[string][]string, 1)
	go func() { produced <- produce(t, e, 16, 100) }()
	testenv.Wait(t, ctx, "the member to be cut off publishing", func() bool { return pubA.N.Load() > 0 })
	proxy.Blackhole()
	cut, n := time.Now(), pubB.N.Load()
	testenv.Wait(t, ctx, "the live member owning every partition", func() bool { return b.Stats().Partitions >= 64 })
	t.Logf("the live member owned every partition %v after the cut (lease %v)", time.Since(cut).Round(time.Millisecond), lease)
	// The cut lasts until the live member published since it (the cut-off one's backlog).
	testenv.Wait(t, ctx, "the live member publishing after the takeover", func() bool { return pubB.N.Load() > n })
	proxy.Heal()
	deliveredInOrder(t, mem, <-produced)
}

// deliveredInOrder waits until the broker holds every produced event, then checks
// nothing was lost and no first delivery came out of order.
func deliveredInOrder(t *testing.T, mem *memory.Broker, want map[string][]string) {
	t.Helper()
	total := 0
	for _, ids := range want {
		total += len(ids)
	}
	testenv.Wait(t, waitCtx(t), "every produced event delivered", func() bool { return len(mem.Messages()) >= total })
	checkDelivery(t, want, mem.Messages())
}

// TestGroupSameRelayIDTwice: two group members run with one relay id, as a restart
// does while the old process still lives (paused, or not yet stopped). The leases'
// epochs do not move between them (the owner is the same), so both claim the same
// partitions at once; the head rule still gives each aggregate's next event to one
// claim at a time, so nothing is lost and no first delivery comes out of order
// (duplicates only). One of #41's questions, answered on the real PostgreSQL.
func TestGroupSameRelayIDTwice(t *testing.T) {
	t.Parallel()
	e := setup(t)
	mem := memory.New(0)
	cfg := func() *relay.Config {
		return &relay.Config{PollInterval: 20 * time.Millisecond, BatchSize: 7, Group: &relay.GroupConfig{RelayID: "same", LeaseTTL: 2 * time.Second}}
	}
	a := relaytest.Start(t, e.store, mem, cfg())
	b := relaytest.Start(t, e.store, mem, cfg())
	ctx := waitCtx(t)
	testenv.Wait(t, ctx, "both processes owning the partitions", func() bool {
		return a.Stats().Partitions >= 64 && b.Stats().Partitions >= 64
	})
	want := produce(t, e, 16, 60)
	deliveredInOrder(t, mem, want)
	t.Logf("published by the first %d, by the second %d, duplicates %d", a.Stats().Published, b.Stats().Published, mem.Duplicates())
}
