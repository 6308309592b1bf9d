package relay_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing/synctest"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// The simulated world of TestSimulation: every call a relay process makes to its
// store and to the broker enters a gate and waits there. The world's one scheduler
// (the bubble's main goroutine) lets calls through one at a time, and only when
// every goroutine of the bubble is blocked (synctest.Wait): the pending calls are
// sorted by what they are (process, kind, detail), and a PRNG seeded by the run's
// seed picks which goes next and what befalls it. Time is the bubble's virtual
// time, so a run of minutes takes milliseconds and a seed replays its schedule.

// simFault is what befalls one call.
type simFault int

const (
	simRun     simFault = iota // the call runs
	simRefused                 // refused before it ran: the database or broker said no
	simLate                    // held for a while, then run; if its caller gives up meanwhile, it still runs then (an outcome the caller never learns)
	simHung                    // never answers until the caller gives up, or the faults heal (the connection then dies)
	simUnknown                 // runs, then the answer is lost: the caller sees an error for what was done
	// Broker calls only: the broker's own misbehaviours, decided per message by
	// broker.Sequence as every publisher's are.
	simDown      // every message refused: the connection's failure
	simRefuse1   // the first message refused (retry), the rest answered
	simCut       // the connection closes after half the call's messages
	simStraggler // the last message answered late, but within the deadline
)

func (f simFault) String() string {
	return [...]string{"run", "refused", "late", "hung", "unknown", "down", "refuse-first", "cut", "straggler"}[f]
}

// errSimCrashed is what a crashed process's calls get: it is gone.
var errSimCrashed = errors.New("sim: the process crashed")

// simCall is one call waiting at the gate.
type simCall struct {
	proc    *simProc
	kind    string // "claim", "complete", "publish", ...
	detail  string // what it carries (seqs, ids): the canonical order among one process's calls
	verdict chan simVerdict
}

type simVerdict struct {
	fault simFault
	delay time.Duration
	// latency is how long a call that runs takes (a round trip): drawn, so that
	// independent timers seldom fall on one instant, where Go's select would pick
	// between them at random and a seed would not replay.
	latency time.Duration
}

func (c *simCall) sortKey() string { return fmt.Sprintf("%03d %s %s", c.proc.id, c.kind, c.detail) }

// simProc is one relay process: its own database handle and driver (its memory: the
// claims in flight), its relay, and its fate.
type simProc struct {
	id int
	// life ends when the process crashes: the context of the statements that run on
	// after their caller stopped waiting (late, or their answer lost), which die with
	// the process.
	life        context.Context
	kill        func()
	dead        bool
	pausedUntil time.Time
	stop        func() // crash or stop: cancels the relay and waits for it
	// step is how far the process's wall clock was stepped (NTP) from the world's,
	// while its monotonic clock runs on: the clock its SQLite driver writes and
	// judges the lease and retries by.
	step   atomic.Int64
	claims int // claims it holds now (coverage: a crash with a claim in hand)
	// store is the process's own store, unwrapped: another session of the process
	// (simLock) claims on it, outside the scheduler.
	store outboxdriver.Store
	// sever ends the process's connections when it crashes (nil: its stop does).
	sever func()
	// relayID is its group member id (group runs).
	relayID string
}

// simWorld is the scheduler, the faults' source and the record of what happened.
type simWorld struct {
	rng   *rand.Rand
	start time.Time

	bg      sync.WaitGroup // late statements still to land
	mu      sync.Mutex
	pending []*simCall
	bell    chan struct{} // rung when a call arrives
	healed  bool
	heal    chan struct{} // closed when the faults stop
	faultP  int           // per mille of calls that get a fault
	trace   []string      // what the scheduler decided, for the story and the hash
	hash    uint64
	reached map[string]int // rare branches reached (coverage)
	details []string       // what calls returned (simWorld.detail)
	leader  *simProc       // the last process to take leadership (coverage: takeovers)
	// disruptions counts what may make the relays send an event again: faulted
	// calls, crashes and pauses (the duplicates' bound).
	disruptions int

	// The broker's log: every message it took, in order, with the time.
	taken []simTaken
	// ledger is the broker's record of a simLedgerBroker's progress (runs with one).
	ledger simLedger
	// Committed event ids, by the time of their commit, and the rolled-back ones.
	committed  map[string]time.Time
	rolledBack map[string]bool
	// claimed is when each claim of a process that held an event returned, and
	// acked when the broker first answered a process that it took an event (not
	// through a ledger): the checks of a late commit.
	claimed map[simSent][]time.Time
	acked   map[simSent]time.Time
}

type simTaken struct {
	id, key string
	at      time.Time
	proc    int
	late    string // the message's outbox-late header
}

// simSent names an event as one process handled it.
type simSent struct {
	proc int
	id   string
}

func newSimWorld(seed uint64, faultP int) *simWorld {
	return &simWorld{
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), start: time.Now(),
		bell: make(chan struct{}, 1), heal: make(chan struct{}), faultP: faultP,
		hash: fnv.New64a().Sum64(), reached: map[string]int{},
		committed: map[string]time.Time{}, rolledBack: map[string]bool{},
		claimed: map[simSent][]time.Time{}, acked: map[simSent]time.Time{},
	}
}

// note records a decision: in the trace (bounded, for the story) and in the hash.
func (w *simWorld) note(format string, args ...any) {
	line := fmt.Sprintf("%8.3fs ", time.Since(w.start).Seconds()) + fmt.Sprintf(format, args...)
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "%d|%s", w.hash, line)
	w.hash = h.Sum64()
	w.trace = append(w.trace, line)
	if len(w.trace) > 4000 {
		w.trace = w.trace[1000:]
	}
}

// detail records what a call returned, for the story of one seed (-sim.seed) only:
// calls may end at one instant in any order, so it is not part of the hash.
func (w *simWorld) detail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.details) < 20000 {
		w.details = append(w.details, fmt.Sprintf("%8.3fs ", time.Since(w.start).Seconds())+fmt.Sprintf(format, args...))
	}
}

func (w *simWorld) reach(branch string) {
	w.mu.Lock()
	w.reached[branch]++
	w.mu.Unlock()
}

// enter is the gate: the call waits for the scheduler's verdict. run does the call;
// broker calls pass their own faults through fault instead of run's error.
func (w *simWorld) enter(ctx context.Context, p *simProc, kind, detail string) (simVerdict, error) {
	c := &simCall{proc: p, kind: kind, detail: detail, verdict: make(chan simVerdict, 1)}
	w.mu.Lock()
	if p.dead {
		w.mu.Unlock()
		return simVerdict{}, errSimCrashed
	}
	w.pending = append(w.pending, c)
	w.mu.Unlock()
	select {
	case w.bell <- struct{}{}:
	default:
	}
	select {
	case v := <-c.verdict:
		return v, nil
	case <-ctx.Done():
		w.mu.Lock()
		w.pending = slices.DeleteFunc(w.pending, func(x *simCall) bool { return x == c })
		w.mu.Unlock()
		return simVerdict{}, ctx.Err()
	}
}

// call runs fn through the gate with the verdict's fault: the store's calls. fn runs
// exactly once unless its process crashed: a call refused, or given up by its caller,
// runs with a context already ended, so that the driver fails it as it fails a call
// the database refused, and cleans up after itself (the SQLite driver's claims in
// flight live in the process). mutates says fn writes: run late, after its caller
// gave up, it still lands, an outcome the caller never learns.
func (w *simWorld) call(ctx context.Context, p *simProc, kind, detail string, mutates bool, fn func(context.Context) error) error {
	v, err := w.enter(ctx, p, kind, detail)
	switch {
	case errors.Is(err, errSimCrashed):
		return err
	case err != nil: // the caller gave up while the call waited (its process paused)
		_ = fn(ctx)
		return err
	}
	time.Sleep(v.latency)
	switch v.fault {
	case simRefused:
		if err := fn(ended(ctx)); err != nil {
			return err
		}
		return fmt.Errorf("sim: %s refused", kind)
	case simLate:
		t := time.NewTimer(v.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if !mutates {
				_ = fn(ctx)
				return ctx.Err()
			}
			// The statement was sent: it lands later, whatever the caller thinks.
			w.bg.Add(1)
			go func() {
				defer w.bg.Done()
				time.Sleep(v.delay)
				if w.alive(p) {
					w.reach("commit-after-caller-gave-up")
					_ = fn(p.life)
				}
			}()
			return ctx.Err()
		}
		if !w.alive(p) {
			return errSimCrashed
		}
		return fn(ctx)
	case simHung:
		select {
		case <-ctx.Done():
		case <-w.heal:
		}
		_ = fn(ended(ctx))
		return errors.New("sim: the connection died")
	case simUnknown:
		if err := fn(p.life); err != nil {
			w.detail("p%d %s %s failed before its answer was lost: %v", p.id, kind, detail, err)
			return err
		}
		if mutates {
			w.reach("commit-outcome-unknown")
		}
		return errors.New("sim: the answer was lost")
	}
	return fn(ctx)
}

// ended is ctx, already cancelled.
func ended(ctx context.Context) context.Context {
	c, cancel := context.WithCancel(ctx)
	cancel()
	return c
}

func (w *simWorld) alive(p *simProc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !p.dead
}

// verdict draws what befalls call c. broker says c is a publish (it has faults of
// its own); the store's calls never hang or stay unknown where the database could
// not (the in-process parts of a claim).
func (w *simWorld) verdict(c *simCall) simVerdict {
	latency := time.Duration(1+w.rng.IntN(2000)) * time.Microsecond
	if w.healed || w.rng.IntN(1000) >= w.faultP {
		return simVerdict{latency: latency}
	}
	var choice []simFault
	switch c.kind {
	case "publish":
		choice = []simFault{simRefused, simLate, simHung, simUnknown, simDown, simRefuse1, simCut, simStraggler, simStraggler}
	case "complete", "settle", "check", "acquire", "cleanup", "resume", "commit", "complete-published",
		"join", "heartbeat", "leases", "leave":
		choice = []simFault{simRefused, simLate, simHung, simUnknown}
	case "claim", "barrier": // a read; the barrier's locks go with its transaction
		choice = []simFault{simRefused, simLate}
	default: // release: the SQLite driver's own memory, which cannot fail
		return simVerdict{latency: latency}
	}
	f := choice[w.rng.IntN(len(choice))]
	v := simVerdict{fault: f, latency: latency}
	if f == simStraggler && w.rng.IntN(2) == 0 {
		v.delay = 1 // the straggler's answer is a refusal
	}
	if f == simLate {
		// Mostly short; sometimes past every deadline and lease (a pause).
		v.delay = time.Duration(1+w.rng.IntN(400)) * time.Millisecond
		if w.rng.IntN(4) == 0 {
			v.delay = time.Duration(1+w.rng.IntN(8000)) * time.Millisecond
		}
	}
	return v
}

// releaseOne lets one pending call go, the PRNG's pick among those whose process is
// not paused; false when none may go.
func (w *simWorld) releaseOne() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var ready []*simCall
	for _, c := range w.pending {
		if !c.proc.pausedUntil.After(now) {
			ready = append(ready, c)
		}
	}
	if len(ready) == 0 {
		return false
	}
	slices.SortStableFunc(ready, func(a, b *simCall) int { return strings.Compare(a.sortKey(), b.sortKey()) })
	c := ready[w.rng.IntN(len(ready))]
	w.pending = slices.DeleteFunc(w.pending, func(x *simCall) bool { return x == c })
	v := w.verdict(c)
	if c.proc.dead {
		v = simVerdict{fault: simRefused}
	}
	if v.fault != simRun {
		w.disruptions++
	}
	w.note("p%d %s %s: %v %v", c.proc.id, c.kind, c.detail, v.fault, v.delay)
	c.verdict <- v
	return true
}

// nextWake is when a paused process's pending call may go (zero: none waits).
func (w *simWorld) nextWake() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var at time.Time
	for _, c := range w.pending {
		if u := c.proc.pausedUntil; u.After(time.Now()) && (at.IsZero() || u.Before(at)) {
			at = u
		}
	}
	return at
}

// idle waits, in virtual time, until a call arrives or until deadline.
func (w *simWorld) idle(deadline time.Time) {
	if wake := w.nextWake(); !wake.IsZero() && wake.Before(deadline) {
		deadline = wake
	}
	d := time.Until(deadline)
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.bell:
	case <-t.C:
	}
}

// quiesce waits until every goroutine of the bubble is blocked.
func quiesce() { synctest.Wait() }

// simStore is a process's gated view of its driver: every call goes through the world.
type simStore struct {
	w     *simWorld
	p     *simProc
	inner outboxdriver.Store
}

func (s *simStore) Capabilities() outboxdriver.Capabilities { return s.inner.Capabilities() }

// Listen: SQLite's wake-ups are in-process only, and the writer is another process.
func (s *simStore) Listen(context.Context) (outboxdriver.Listener, error) {
	return nil, outboxdriver.ErrNotSupported
}

func (s *simStore) Cleanup(ctx context.Context, p *outboxdriver.CleanupParams) (n int64, err error) {
	err = s.w.call(ctx, s.p, "cleanup", "", true, func(ctx context.Context) error {
		n, err = s.inner.Cleanup(ctx, p)
		return err
	})
	return n, err
}

func (s *simStore) Claim(ctx context.Context, p *outboxdriver.ClaimParams) (outboxdriver.Claim, error) {
	var c outboxdriver.Claim
	err := s.w.call(ctx, s.p, "claim", fmt.Sprintf("limit=%d ahead=%d skip=%d", p.Limit, len(p.Ahead), len(p.Skip)), false, func(ctx context.Context) error {
		var err error
		c, err = s.inner.Claim(ctx, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.w.mu.Lock()
	s.p.claims++
	s.w.mu.Unlock()
	var got []string
	for _, r := range c.Rows() {
		got = append(got, fmt.Sprintf("%d:%s/%s", r.Seq, r.AggregateID, shortID(r.ID)))
	}
	s.w.detail("p%d claimed %v", s.p.id, got)
	s.w.mu.Lock()
	for _, r := range c.Rows() {
		k := simSent{s.p.id, r.ID}
		s.w.claimed[k] = append(s.w.claimed[k], time.Now())
	}
	s.w.mu.Unlock()
	return &simClaim{s: s, inner: c, detail: seqSpan(c.Rows())}, nil
}

func seqSpan(rows []outboxdriver.Row) string {
	if len(rows) == 0 {
		return "[]"
	}
	return fmt.Sprintf("[%d..%d #%d]", rows[0].Seq, rows[len(rows)-1].Seq, len(rows))
}

func (s *simStore) AcquireLeadership(ctx context.Context, p *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	var l outboxdriver.Leadership
	err := s.w.call(ctx, s.p, "acquire", "", true, func(ctx context.Context) error {
		var err error
		l, err = s.inner.AcquireLeadership(ctx, p)
		return err
	})
	if err != nil || l == nil {
		if l != nil { // acquired, but the answer was lost: the lease stays until it expires
			s.w.reach("leadership-answer-lost")
		}
		return nil, err
	}
	s.w.mu.Lock()
	if prev := s.w.leader; prev != nil && prev != s.p {
		s.w.reached["takeover"]++
		if prev.dead || prev.claims > 0 {
			s.w.reached["takeover-from-crashed-or-claiming"]++
		}
	}
	s.w.leader = s.p
	s.w.mu.Unlock()
	if _, ok := l.(outboxdriver.LeaseBound); ok {
		return &simLeaseLead{simLead{s: s, inner: l}}, nil
	}
	return &simLead{s: s, inner: l}, nil
}

type simLead struct {
	s     *simStore
	inner outboxdriver.Leadership
}

func (l *simLead) Check(ctx context.Context) error {
	return l.s.w.call(ctx, l.s.p, "check", "", true, l.inner.Check)
}

func (l *simLead) Release(ctx context.Context) error {
	return l.s.w.call(ctx, l.s.p, "resign", "", true, l.inner.Release)
}

// simLeaseLead is a leadership with a bound of its own (SQLite's lease).
type simLeaseLead struct{ simLead }

// Bound passes the SQLite lease's own bound through: the relay fences itself by it.
func (l *simLeaseLead) Bound() time.Duration { return l.inner.(outboxdriver.LeaseBound).Bound() }

type simClaim struct {
	s      *simStore
	inner  outboxdriver.Claim
	detail string
	once   sync.Once
}

func (c *simClaim) Rows() []outboxdriver.Row { return c.inner.Rows() }

func (c *simClaim) ended() {
	c.once.Do(func() {
		c.s.w.mu.Lock()
		c.s.p.claims--
		c.s.w.mu.Unlock()
	})
}

func (c *simClaim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if anyDead(p) {
		c.s.w.reach("dead-letter")
		c.s.w.mu.Lock()
		if c.s.w.leader != nil && c.s.w.leader != c.s.p { // another process took leadership since
			c.s.w.reached["dead-letter-after-term-lost"]++
		}
		c.s.w.mu.Unlock()
	}
	defer c.ended()
	c.s.w.detail("p%d completes %s: %s", c.s.p.id, c.detail, paramsText(p))
	return c.s.w.call(ctx, c.s.p, "complete", c.detail+completeDetail(p), true, func(ctx context.Context) error {
		return c.inner.Complete(ctx, p)
	})
}

func (c *simClaim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	c.s.w.reach("settle")
	c.s.w.detail("p%d settles %s: %s", c.s.p.id, c.detail, paramsText(p))
	return c.s.w.call(ctx, c.s.p, "settle", c.detail+completeDetail(p), true, func(ctx context.Context) error {
		return c.inner.(outboxdriver.Settler).Settle(ctx, p)
	})
}

func (c *simClaim) Release(ctx context.Context) error {
	defer c.ended()
	return c.s.w.call(ctx, c.s.p, "release", c.detail, false, c.inner.Release)
}

func anyDead(p *outboxdriver.CompleteParams) bool {
	for _, f := range p.Failed {
		if f.Dead {
			return true
		}
	}
	return false
}

func paramsText(p *outboxdriver.CompleteParams) string {
	var b strings.Builder
	for _, id := range p.Published {
		b.WriteString(" +" + shortID(id))
	}
	for _, f := range p.Failed {
		fmt.Fprintf(&b, " -%s(dead=%v count=%v %.40s)", shortID(f.ID), f.Dead, f.CountAttempt, f.Error)
	}
	return b.String()
}

func completeDetail(p *outboxdriver.CompleteParams) string {
	return fmt.Sprintf(" published=%d failed=%d", len(p.Published), len(p.Failed))
}

// simBroker is the broker: it decides each message's fate through broker.Sequence,
// as every publisher does, and logs every message it takes.
type simBroker struct {
	w        *simWorld
	p        *simProc
	maxBytes int
}

const simAckTimeout = 2 * time.Second

func (b *simBroker) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	return b.publish(ctx, msgs, nil)
}

// publish is Publish; with stage set, the messages the broker takes are staged there
// (a transaction's, for simLedgerBroker to commit) instead of going to its log.
func (b *simBroker) publish(ctx context.Context, msgs []broker.Message, stage *[]simTaken) []broker.Result {
	detail := fmt.Sprintf("%s #%d", shortID(msgs[0].ID), len(msgs))
	ids := make([]string, len(msgs))
	for i := range msgs {
		ids[i] = shortID(msgs[i].ID)
	}
	b.w.detail("p%d publishes %v", b.p.id, ids)
	v, err := b.w.enter(ctx, b.p, "publish", detail)
	if err == nil {
		time.Sleep(v.latency)
	}
	if err == nil && v.fault == simRefused {
		err = errors.New("sim: the broker refused the call")
	}
	if err == nil && v.fault == simLate {
		t := time.NewTimer(v.delay)
		select {
		case <-t.C:
			if !b.w.alive(b.p) {
				err = errSimCrashed
			}
		case <-ctx.Done():
			t.Stop()
			err = ctx.Err()
		}
	}
	if err == nil && v.fault == simHung {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-b.w.heal:
			err = errors.New("sim: the broker connection died")
		}
	}
	if err != nil {
		res := make([]broker.Result, len(msgs))
		for i := range res {
			res[i].Err = broker.Unavailable(err)
		}
		return res
	}
	if v.fault == simStraggler {
		b.w.reach("straggler")
	}
	results := broker.Sequence(ctx, msgs, broker.Schedule{AckTimeout: simAckTimeout}, broker.Sender{
		Prepare: func(_ context.Context, i int) error {
			switch {
			case v.fault == simDown:
				return broker.Unavailable(errors.New("sim: broker down"))
			case v.fault == simCut && i >= len(msgs)/2:
				return broker.Unavailable(errors.New("sim: the broker connection closed"))
			case v.fault == simRefuse1 && i == 0:
				return errors.New("sim: refused, try again")
			case len(msgs[i].Payload) > b.maxBytes:
				return broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the limit of %d", len(msgs[i].Payload), b.maxBytes))
			}
			return nil
		},
		Send: func(_ context.Context, i int) (broker.Future, error) {
			b.w.mu.Lock()
			taken := simTaken{id: msgs[i].ID, key: msgs[i].Key, at: time.Now(), proc: b.p.id, late: msgs[i].Headers[wire.HeaderLate]}
			if stage != nil {
				*stage = append(*stage, taken)
			} else {
				b.w.taken = append(b.w.taken, taken)
			}
			b.w.mu.Unlock()
			switch {
			case v.fault == simUnknown:
				b.w.reach("publish-answer-lost")
				return noAnswer{}, nil
			case v.fault == simStraggler && i == len(msgs)-1:
				if v.delay > 0 { // refused, late: its aggregate's later events must wait for it
					return lateRefusal{at: time.Now().Add(simAckTimeout / 2)}, nil
				}
				return slowAnswer{at: time.Now().Add(simAckTimeout / 2)}, nil
			}
			return broker.Answered{}, nil
		},
	})
	if stage == nil {
		b.w.mu.Lock()
		for i, res := range results {
			k := simSent{b.p.id, msgs[i].ID}
			if _, ok := b.w.acked[k]; res.Err == nil && !ok {
				b.w.acked[k] = time.Now()
			}
		}
		b.w.mu.Unlock()
	}
	return results
}

// lateRefusal is a refusal that comes at a given time.
type lateRefusal struct{ at time.Time }

func (a lateRefusal) Wait(ctx context.Context) error {
	if err := slowAnswer(a).Wait(ctx); err != nil {
		return err
	}
	return errors.New("sim: refused, late")
}

func (b *simBroker) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true, MaxMessageBytes: b.maxBytes}
}
func (b *simBroker) Close() error { return nil }

func shortID(id string) string { return id[len(id)-6:] }

// simGroupStore is simStore for a store that lets several relays run at once (the
// PostgreSQL model): a group's calls go through the gate too; the operator's (Admin),
// which the relay does not call, go straight to the store.
type simGroupStore struct {
	*simStore
	outboxdriver.Admin
	group outboxdriver.GroupStore
}

func (s *simGroupStore) AcquireMembership(ctx context.Context) (outboxdriver.Leadership, error) {
	var l outboxdriver.Leadership
	err := s.w.call(ctx, s.p, "join", "", true, func(ctx context.Context) error {
		var err error
		l, err = s.group.AcquireMembership(ctx)
		return err
	})
	if err != nil || l == nil {
		return nil, err
	}
	return &simLead{s: s.simStore, inner: l}, nil
}

func (s *simGroupStore) Heartbeat(ctx context.Context, p *outboxdriver.HeartbeatParams) (m *outboxdriver.Membership, err error) {
	err = s.w.call(ctx, s.p, "heartbeat", "", true, func(ctx context.Context) error {
		m, err = s.group.Heartbeat(ctx, p)
		return err
	})
	return m, err
}

func (s *simGroupStore) Leases(ctx context.Context, p *outboxdriver.LeaseParams) (ls []outboxdriver.Lease, err error) {
	err = s.w.call(ctx, s.p, "leases", fmt.Sprint(len(p.Want)), true, func(ctx context.Context) error {
		ls, err = s.group.Leases(ctx, p)
		return err
	})
	for _, l := range ls {
		if l.Epoch > 1 {
			s.w.reach("group-lease-taken-over")
			break
		}
	}
	return ls, err
}

func (s *simGroupStore) Barrier(ctx context.Context, partitions []int) error {
	s.w.reach("group-barrier")
	return s.w.call(ctx, s.p, "barrier", fmt.Sprint(len(partitions)), false, func(ctx context.Context) error {
		return s.group.Barrier(ctx, partitions)
	})
}

func (s *simGroupStore) Leave(ctx context.Context, relayID string) error {
	return s.w.call(ctx, s.p, "leave", "", true, func(ctx context.Context) error {
		return s.group.Leave(ctx, relayID)
	})
}
