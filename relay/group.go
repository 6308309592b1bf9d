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
	// check runs between batches, every interval; an error ends the term.
	check(ctx context.Context) error
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

// check heartbeats, works out this relay's share of the partitions (partition p goes
// to the (p mod n)-th live relay in id order), gives up the rest and leases its share.
// A partition that changed hands is used only once the previous owner's claims have
// ended (the barrier), so a paused owner's locked rows are never overtaken.
func (g *groupTerm) check(ctx context.Context) error {
	if err := g.member.Check(ctx); err != nil {
		return err
	}
	m, err := g.gs.Heartbeat(ctx, &outboxdriver.HeartbeatParams{RelayID: g.id, Info: hostInfo(), TTL: g.ttl})
	if err != nil {
		return err
	}
	me := slices.Index(m.Relays, g.id)
	var want []int
	if me >= 0 {
		for p := me; p < m.Partitions; p += len(m.Relays) {
			want = append(want, p)
		}
	}
	renewed := time.Now()
	leases, err := g.gs.Leases(ctx, &outboxdriver.LeaseParams{RelayID: g.id, Want: want, TTL: g.ttl})
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
		bctx, cancel := context.WithTimeout(ctx, g.ttl/2)
		err := g.gs.Barrier(bctx, fresh)
		cancel()
		if err != nil {
			g.r.log.Warn("relay: new partitions still locked by their previous owner; retrying", "partitions", len(fresh), "err", err)
			fresh = nil
		}
		for _, l := range leases {
			if slices.Contains(fresh, l.Partition) {
				ready[l.Partition] = l
			}
		}
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
	bo := r.newBackoff()
	waiting := false
	for ctx.Err() == nil {
		member, err := gs.AcquireMembership(ctx)
		if err != nil || member == nil {
			switch {
			case ctx.Err() != nil:
			case err != nil:
				r.log.Error("relay: cannot reach the database to join the group", "err", err)
				sleep(ctx, bo.next())
			default:
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
		if err := g.check(ctx); err != nil {
			r.releaseLock(ctx, member)
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
