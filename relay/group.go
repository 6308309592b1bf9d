package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// term is one stretch of a relay's work: the single active relay's leadership, or a
// group member's partition leases. The pipeline in lead is the same for both.
type term interface {
	// check runs between batches, every interval; an error ends the term. out are
	// the lease partitions of rows still out at the broker (a slow key's), which a
	// group member keeps.
	check(ctx context.Context, out []int) error
	interval() time.Duration
	// drainsBeforeCheck says check may change what the relay owns: lead then drops its prefetched
	// claim and waits for the marks first (a handover drains in-flight work).
	drainsBeforeCheck() bool
	claimParams(limit int) *outboxdriver.ClaimParams
	// publishable reports whether a claim's rows may still go to the broker.
	publishable(rows []outboxdriver.Row) bool
}

// groupTerm is a group member's: the partitions assigned to it, leased with epochs.
type groupTerm struct {
	r      *Relay
	gs     outboxdriver.GroupStore
	member outboxdriver.Leadership // the table lock, shared with the other members
	id     string
	ttl    time.Duration

	ready      map[int]outboxdriver.Lease // leased, and no previous owner's claim left
	validUntil time.Time                  // by this relay's clock, with a margin
	// tableResumed: the table's own ledger was resumed in this term (ledger.go).
	tableResumed bool
}

func (g *groupTerm) interval() time.Duration { return g.ttl / 3 }
func (g *groupTerm) drainsBeforeCheck() bool { return true }

func (g *groupTerm) claimParams(limit int) *outboxdriver.ClaimParams {
	leases := make([]outboxdriver.Lease, 0, len(g.ready))
	for _, l := range g.ready {
		leases = append(leases, l)
	}
	return &outboxdriver.ClaimParams{Limit: limit, HoldTimeout: g.ttl, Group: &outboxdriver.ClaimGroup{RelayID: g.id, Leases: leases}}
}

func (g *groupTerm) publishable(rows []outboxdriver.Row) bool {
	if !time.Now().Before(g.validUntil) {
		return false
	}
	for i := range rows {
		if _, ok := g.ready[rows[i].Partition]; !ok {
			return false
		}
	}
	return true
}

// check heartbeats, works out this relay's share of the partitions (share), gives up
// the rest and leases its share. A partition of out that it holds stays its own past
// its share until those rows are settled: another member would claim them (unlocked,
// unpublished) and send them again while their first copies are still out, and this
// member's settle, fenced by the old epoch, would write nothing. (Order would hold
// without it: the other member sends the held event before its aggregate's later
// ones, and the inbox drops the late copy. The simulation checks order either way.)
// A partition that changed hands waits up to half a lease for the previous owner's
// claims to end (the barrier), so their marks land before it is claimed again. Order
// does not rest on the barrier: the head rule never lets a claim take a row behind a
// held one, whoever holds it, so a barrier still blocked after that (a paused owner,
// or any session's row lock) lets the partitions go on; only the held rows'
// aggregates wait for their locks. Each call is bounded by LeaderTimeout.
func (g *groupTerm) check(ctx context.Context, out []int) error {
	if err := bounded(ctx, g.r.cfg.LeaderTimeout, g.member.Check); err != nil {
		return err
	}
	var m *outboxdriver.Membership
	err := bounded(ctx, g.r.cfg.LeaderTimeout, func(ctx context.Context) (err error) {
		m, err = g.gs.Heartbeat(ctx, &outboxdriver.HeartbeatParams{RelayID: g.id, Info: hostInfo(), TTL: g.ttl})
		return err
	})
	if err != nil {
		return err
	}
	want := share(m.Relays, slices.Index(m.Relays, g.id), m.Partitions)
	for _, part := range out {
		if _, ok := g.ready[part]; ok && !slices.Contains(want, part) {
			want = append(want, part)
		}
	}
	renewed := time.Now()
	var leases []outboxdriver.Lease
	err = bounded(ctx, g.r.cfg.LeaderTimeout, func(ctx context.Context) (err error) {
		leases, err = g.gs.Leases(ctx, &outboxdriver.LeaseParams{RelayID: g.id, Want: want, TTL: g.ttl})
		return err
	})
	if err != nil {
		return err
	}
	ready := make(map[int]outboxdriver.Lease, len(leases))
	var fresh []int
	for _, l := range leases {
		if old, ok := g.ready[l.Partition]; ok && old.Epoch == l.Epoch {
			ready[l.Partition] = l
			continue
		}
		fresh = append(fresh, l.Partition)
	}
	if len(fresh) > 0 {
		if err := bounded(ctx, min(g.ttl/2, g.r.cfg.LeaderTimeout), func(ctx context.Context) error { return g.gs.Barrier(ctx, fresh) }); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			g.r.log.Info("relay: rows of new partitions still locked (a previous owner's claim, or another session); "+
				"going on: their aggregates wait for the locks, the others flow", "partitions", len(fresh), "err", err)
		}
		if g.r.units != nil {
			var tableDone bool
			fresh, tableDone, err = g.r.resumeUnits(ctx, min(g.ttl/2, g.r.cfg.LeaderTimeout), fresh, !g.tableResumed)
			if err != nil {
				return err
			}
			g.tableResumed = g.tableResumed || tableDone
		}
		for _, l := range leases {
			if slices.Contains(fresh, l.Partition) {
				ready[l.Partition] = l
			}
		}
	}
	if g.r.units != nil {
		g.r.units.keep(leases)
	}
	if len(ready) != len(g.ready) {
		g.r.log.Info("relay: partitions", "relay", g.id, "owned", len(ready), "wanted", len(want), "relays", len(m.Relays))
	}
	g.ready = ready
	g.validUntil = renewed.Add(g.ttl * 3 / 4)
	g.r.setPartitions(len(ready))
	return nil
}

// runGroup runs the relay as one of several active relays of the table.
func (r *Relay) runGroup(ctx context.Context) error {
	gs := r.store.(outboxdriver.GroupStore) // New checked it
	id, ttl := r.cfg.Group.RelayID, r.cfg.Group.LeaseTTL
	defer func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := gs.Leave(lctx, id); err != nil {
			r.log.Warn("relay: could not leave the group; its partitions free up when the leases expire", "err", err)
		}
	}()
	if r.units != nil {
		defer r.units.closeAll()
	}
	bo := r.newBackoff("group")
	waiting := false
	for ctx.Err() == nil {
		var member outboxdriver.Leadership
		err := bounded(ctx, r.cfg.LeaderTimeout, func(ctx context.Context) (err error) {
			member, err = gs.AcquireMembership(ctx)
			return err
		})
		if err != nil || member == nil {
			switch {
			case ctx.Err() != nil:
			case err != nil:
				r.log.Error("relay: cannot reach the database to join the group", "err", err)
				sleep(ctx, bo.next())
			default:
				r.stats.standby.Add(1)
				if !waiting {
					r.log.Warn("relay: a relay outside the group (no --group, or CDC) holds the table; waiting")
					waiting = true
				}
				sleep(ctx, r.cfg.LeaderRetry)
			}
			continue
		}
		waiting = false
		g := &groupTerm{r: r, gs: gs, id: id, ttl: ttl, member: member}
		if r.units != nil {
			r.units.newTerm()
		}
		if err := g.check(ctx, nil); err != nil {
			r.releaseLock(ctx, member)
			if errStop(err) && ctx.Err() == nil {
				r.log.Error("relay: stopping", "err", err)
				return err
			}
			if ctx.Err() == nil {
				r.log.Error("relay: cannot join the group", "err", err)
				sleep(ctx, bo.next())
			}
			continue
		}
		bo.reset()
		r.log.Info("relay: active in a group", "relay", id, "lease_ttl", ttl)
		r.stats.leader.Store(true)
		r.hook("LeaderChanged", func(h Hooks) { h.LeaderChanged(true) })
		err = r.lead(ctx, g)
		r.releaseLock(ctx, member)
		r.setPartitions(0)
		r.notLeader()
		if errStop(err) && ctx.Err() == nil {
			r.log.Error("relay: stopping", "err", err)
			return err
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("relay: group term ended", "err", err)
			sleep(ctx, bo.next())
		}
	}
	return nil
}

func (r *Relay) setPartitions(n int) {
	if r.stats.partitions.Swap(int64(n)) == int64(n) {
		return
	}
	r.hook("PartitionsOwned", func(h Hooks) {
		if gh, ok := h.(GroupHooks); ok {
			gh.PartitionsOwned(n)
		}
	})
}

// DefaultRelayID names a relay by host, process and a random suffix.
func DefaultRelayID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", hostInfo(), os.Getpid(), hex.EncodeToString(b))
}

func hostInfo() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}
