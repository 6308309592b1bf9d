// Package relay publishes committed outbox events to a broker: claim, publish, then
// mark (or delete) only what the broker acknowledged, with per-event retries, dead
// letters and per-aggregate ordering. The store (package outboxdriver) is either a
// table polled with FOR UPDATE SKIP LOCKED or the CDC source of package pgcdc.
//
// # One active relay (the default)
//
// The relay takes the table's lock (a PostgreSQL advisory lock, GET_LOCK on MySQL, a
// lease row on SQLite). The others wait as hot standbys and retry every LeaderRetry.
//
// The lock is one the database revokes by itself. The lock's session runs with
// idle_session_timeout = LeaderTimeout (PostgreSQL 14+; TCP keepalives and
// tcp_user_timeout as well, for a peer that vanished, also on older servers); on
// MySQL with wait_timeout = LeaderTimeout (whole seconds); a CDC relay's replication
// connection with wal_sender_timeout = LeaderTimeout. The active relay proves it is
// alive with a heartbeat on that session every LeaderCheck (at most LeaderTimeout/4),
// from a goroutine of its own so a slow batch never starves it, each with a deadline.
// It fences itself by its own clock: a batch goes to the broker only while its last
// heartbeat, counted from when it was sent, is younger than 3/4·LeaderTimeout; the
// database cannot end the session (and let a standby in) before the full bound. Its
// claims run with idle_in_transaction_session_timeout = LeaderTimeout (MySQL: the
// claim's session with that wait_timeout), so a paused relay's row locks go too. Not
// at the same moment: each session's silence counts from its own last call, and a
// claim can outlive the lock's session. A claim holds a claim fence, shared, for its
// life (an advisory lock; MySQL: the migrations table's first row), and a new leader
// waits to take it before it claims; without it, its SKIP LOCKED claim would pass
// the rows still locked and publish an aggregate's later events first (the driver
// suite's LeaderWaitsForOldClaims). Every database call has LeaderTimeout as its
// deadline; a LISTEN session silent that long is opened again.
//
// What happens, with the default LeaderTimeout of 10 s:
//
//   - crash (kill -9, machine gone with its TCP stack answering resets): the session
//     ends at once; a standby takes over within LeaderRetry.
//   - pause (SIGSTOP, a VM frozen, a long GC) or a cut network, a NAT or load balancer
//     that dropped its state (half-open connections): the server ends the idle lock
//     session after LeaderTimeout; a standby publishes within LeaderTimeout +
//     LeaderRetry (measured: 10.0 s, TestPartitionedLeader; CDC 3.1 s with a 3 s
//     bound, TestPartitionedCDCRelay). The paused relay stopped publishing at
//     3/4·LeaderTimeout; when it resumes, its heartbeat fails, it drops what it holds
//     (its claim's transaction is gone, so it marks nothing) and becomes a standby.
//     A batch it had already handed to the broker before the pause may arrive again:
//     duplicates only, never an earlier first delivery after a later one.
//   - a group member paused or cut off: its partition leases lapse after LeaseTTL and
//     the live members take them (measured: every partition 2.0 s after the cut with a
//     2 s lease, TestPartitionedGroupMember); its write-backs are fenced by epoch.
//   - SQLite: the lease row lasts its TTL (outboxsqlite.Options.LeaseTTL, 5 s) and
//     plays the same part; the relay fences itself by it.
//
// The cost: a heartbeat query per LeaderCheck, one set of session settings per term,
// and a LISTEN reconnect per LeaderTimeout of silence.
//
// # Several active relays (Config.Group, PostgreSQL)
//
// Every row belongs to one of P partitions, computed by the database from
// (aggregatetype, aggregateid) and fixed at migration, so all events of an aggregate
// share a partition. Each partition has a lease row: owner, epoch, lease_until.
// A member relay goes through these states:
//
//	joining ──heartbeat──▶ member ──every LeaseTTL/3, between batches──▶ rebalancing ─┐
//	   ▲                     ▲                                                      │
//	   │                     └──────────── leases renewed / taken / released ◀──────┘
//	   └── error (database gone, lease call failed): backoff, then join again
//	stop ──▶ leave (leases freed at once, registry row removed)
//
// Rebalancing, one transaction per step, always with nothing in hand (the prefetched
// claim is given back and the previous batch's mark has landed, so a handover drains
// in-flight work first):
//
//  1. Heartbeat: upsert this relay's registry row; read the live relays (heartbeat
//     younger than LeaseTTL), sorted by id.
//  2. Share: each partition goes to the live relay it ranks first (rendezvous hashing)
//     among those with fewer than ceil(partitions/n): a join or leave moves about the
//     partitions the relay takes or held.
//  3. Leases: free this relay's leases outside its share; renew those it holds; take
//     those of its share that are free or expired, each with epoch+1. A partition held
//     by a relay that is alive is never taken: the new owner waits until the old one
//     releases it or its lease expires.
//  4. Barrier: for a partition just taken, lock every unpublished row of it once
//     (waiting behind any claim a previous owner still holds), then let go, so the
//     old claims' marks land before the rows are claimed again (fewer duplicates). It
//     waits half a lease at most: order does not rest on it but on the head rule (a
//     claim never takes a row behind an earlier unpublished row of its aggregate that
//     it does not take too, whoever holds that row), so a row still locked then (a
//     paused owner, an operator's open transaction) holds back only its aggregate. A
//     paused owner's claim cannot outlive its lease for long: claims run with
//     idle_in_transaction_session_timeout = LeaseTTL, so the server ends the session
//     and its row locks.
//
// Fencing. A member claims only rows of partitions it holds, as the database sees the
// leases when the claim's statement runs (a claim sent before a cut and delivered after
// the takeover locks nothing: the new owner never skips an aggregate's earlier row), and:
//
//   - before publishing a batch it checks that its leases are still valid by its own
//     clock (renewed at t, trusted until t + 3/4·LeaseTTL); otherwise it gives the batch
//     back unpublished and rebalances;
//   - its write-back (mark, delete, failure, dead letter) applies only to rows whose
//     partition is still leased to it at the epoch it claimed under, in the same
//     statement. A relay that lost a partition while paused therefore cannot mark or
//     delete its rows afterwards: the new owner publishes them again (a duplicate within
//     the in-flight window, absorbed by the broker's dedup id and the inbox), and
//     order per aggregate holds because only one relay at a time claims a partition
//     and no claim passes a held row of its aggregate.
//
// A batch whose publishing outlasts LeaseTTL (leases are renewed between batches) loses
// its leases, and its rows are published again by their new owner: keep LeaseTTL well
// above the broker's slowest answer for a whole batch. One slow aggregate does not
// count: after StragglerAfter the batch is split around it, and the member keeps that
// partition's lease until its answers came (docs/architecture.md).
//
// Group members hold the table's lock shared; a relay outside the group (and the CDC
// relay) holds it exclusively. So the two kinds never run at once on a table: members
// wait while a single active relay runs, and the other way round.
package relay
