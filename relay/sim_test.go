package relay_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

// TestSimulation runs the real relay, several processes of it on one SQLite file,
// in a simulated world (simworld_test.go): virtual time, every store and broker call
// through one scheduler, and a seeded PRNG choosing the interleaving, the faults
// (refused, late, hung, answer lost), crashes, restarts and pauses. After the faults
// stop, every event must be out within a bound worked out from the configuration.
// Checked after every run:
//   - every committed good event reached the broker, none before its commit, no
//     rolled-back one ever;
//   - per aggregate, first deliveries in write order (a bad event, dead, excepted);
//   - every bad event is a dead letter with its reason, and no good one is;
//   - liveness: all of it within simLiveness of the faults' end, in virtual time.
//
// Each run prints nothing unless it fails; a failure names its seed and the command
// that replays it (docs/testing.md). The same seed gives the same schedule: a sample
// of seeds is run twice and their trace hashes compared.
var (
	simSeed  = flag.Uint64("sim.seed", 0, "TestSimulation: run this seed only (its trace is printed)")
	simRuns  = flag.Int("sim.runs", 0, "TestSimulation: how many seeds (default: OUTBOX_SIM_RUNS, else a CI sample)")
	simBase  = flag.Uint64("sim.base", 0, "TestSimulation: the first seed of the sample (0: from the clock, a new sample each run)")
	simOn    = flag.String("sim.store", "", "TestSimulation: run every seed on this database, sqlite or postgres (default: each seed draws one; a forced one changes the seed's schedule)")
	simGroup = flag.String("sim.group", "", "TestSimulation: on or off: run every PostgreSQL seed as a group of active relays, or none (default: each seed draws)")
)

// simRunsDefault is how many seeds TestSimulation runs by default: fewer under the
// race detector, which slows each run twentyfold.
func simRunsDefault() int {
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_SIM_RUNS")); err == nil && n > 0 {
		return n
	}
	if raceEnabled { // TestSimulationSlice runs the thousand, without it
		return 20
	}
	return 400
}

// The world's fixed settings. Times are virtual.
const (
	simFaultPhase = 20 * time.Second // faults, crashes and pauses happen in it
	simLeaseTTL   = 2 * time.Second  // SQLite's leadership lease
	simMaxBytes   = 256              // the broker's limit: bad events are larger
	simMaxLate    = 8 * time.Second  // the longest a late call is held (simWorld.verdict)
)

// simRelayConfig is every process's relay configuration.
func simRelayConfig(rng *rand.Rand) relay.Config {
	return relay.Config{
		BatchSize: 1 + rng.IntN(6), PollInterval: 100 * time.Millisecond,
		LeaderRetry: 300 * time.Millisecond, LeaderCheck: 200 * time.Millisecond,
		BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second,
		RetryMin: 100 * time.Millisecond, RetryMax: 2 * time.Second, MaxAttempts: 1000,
		StragglerAfter: 200 * time.Millisecond, DrainTimeout: 2 * time.Second,
		FlowPastDeadLetters: true,
		Completion:          [...]outboxdriver.Completion{outboxdriver.CompleteMark, outboxdriver.CompleteDelete}[rng.IntN(2)],
	}
}

// simLiveness bounds, once the faults stop, how long the relays may take to publish
// everything: the longest late call still held, then a dead leader's lease, a
// standby's retry, the longest backoff, the longest retry delay and the broker's
// answer deadline, one after the other; doubled, for a pass that was already under
// way when each of them ended.
func simLiveness(cfg relay.Config) time.Duration {
	return 2 * (simMaxLate + simLeaseTTL + cfg.LeaderRetry + cfg.BackoffMax + cfg.RetryMax + simAckTimeout)
}

// simEvent is one event of the script.
type simEvent struct {
	ev  outbox.Event
	bad bool
}

// simTx is one transaction of the script: its events, committed or rolled back.
type simTx struct {
	at       time.Duration
	events   []simEvent
	rollback bool
	// open is how long the transaction stays open after its insert, others
	// committing meanwhile (PostgreSQL only: writers that do not serialize an
	// aggregate, whose commits come opposite to their inserts). 0: it commits at once.
	open time.Duration
}

// simAction is a process's fate: crash (and restart after dur), pause (for dur), or
// a step of its wall clock (by dur, forward or back).
type simAction struct {
	at   time.Duration
	kind simActionKind
	proc int // index among the live processes, modulo
	dur  time.Duration
	// replace: in a group, a pause is met by a new process under the paused one's
	// relay id (a restart while the old process is only hung).
	replace bool
}

type simActionKind int

const (
	simCrash simActionKind = iota
	simPause
	simClockStep
)

// simLock is another session holding the row locks of the oldest unpublished events
// for dur: an operator's open transaction, a reporting job's SELECT … FOR UPDATE. On
// SQLite, whose driver stands in for row locks with the claims its process has in
// flight, it is a claim of the head rows on every live process's store, released
// after dur; the head rule must keep their aggregates' later events back.
type simLock struct {
	at   time.Duration
	rows int
	dur  time.Duration
}

// simScript is everything a seed decides before the run.
type simScript struct {
	procs   int
	faultP  int
	cfg     relay.Config
	txs     []simTx
	actions []simAction
	locks   []simLock
	// ledger: the relays publish through a broker with a ledger (Kafka's
	// transactions): no event may reach it twice.
	ledger bool
	// store is the database the processes share.
	store simStoreKind
	// group: the processes run as a group of active relays, each leasing its share
	// of the partitions (PostgreSQL only).
	group bool
}

// simStoreKind is a run's database: SQLite's file, or the PostgreSQL model.
type simStoreKind string

const (
	simSQLite   simStoreKind = "sqlite"
	simPostgres simStoreKind = "postgres (model)"
)

func newSimScript(seed uint64, rng *rand.Rand) *simScript {
	s := &simScript{procs: 2 + rng.IntN(2), faultP: []int{0, 50, 150, 300}[rng.IntN(4)], cfg: simRelayConfig(rng)}
	aggs := 1 + rng.IntN(5)
	for range 3 + rng.IntN(20) {
		tx := simTx{at: time.Duration(rng.Int64N(int64(simFaultPhase))), rollback: rng.IntN(8) == 0}
		for range 1 + rng.IntN(4) {
			bad := rng.IntN(12) == 0
			payload := fmt.Sprintf(`{"n":%d}`, rng.IntN(1000))
			if bad {
				payload = `{"pad":"` + strings.Repeat("x", simMaxBytes) + `"}`
			}
			tx.events = append(tx.events, simEvent{bad: bad, ev: outbox.Event{
				ID: simUUID(rng), AggregateType: "order", AggregateID: fmt.Sprint("a", rng.IntN(aggs)),
				Type: "T", Payload: []byte(payload),
			}})
		}
		s.txs = append(s.txs, tx)
	}
	slices.SortStableFunc(s.txs, func(a, b simTx) int { return int(a.at - b.at) })
	for range rng.IntN(6) {
		a := simAction{at: time.Duration(rng.Int64N(int64(simFaultPhase))), kind: simActionKind(rng.IntN(3)), proc: rng.IntN(3)}
		a.dur = time.Duration(100+rng.IntN(6000)) * time.Millisecond
		if a.kind == simClockStep && rng.IntN(2) == 0 {
			a.dur = -a.dur
		}
		s.actions = append(s.actions, a)
	}
	slices.SortStableFunc(s.actions, func(a, b simAction) int { return int(a.at - b.at) })
	// From a stream of their own, so that the draws above (and every seed's schedule
	// before locks were simulated) stay as they were.
	lrng := rand.New(rand.NewPCG(seed, 1))
	for range lrng.IntN(5) {
		s.locks = append(s.locks, simLock{at: time.Duration(lrng.Int64N(int64(simFaultPhase))), rows: 1 + lrng.IntN(3),
			dur: time.Duration(100+lrng.IntN(4000)) * time.Millisecond})
	}
	slices.SortStableFunc(s.locks, func(a, b simLock) int { return int(a.at - b.at) })
	s.ledger = rand.New(rand.NewPCG(seed, 2)).IntN(3) == 0
	// Half the runs on the PostgreSQL model, drawn apart too: a SQLite run's schedule
	// is the one it had before the model existed.
	s.store = simSQLite
	if pg := rand.New(rand.NewPCG(seed, 3)).IntN(2) == 0; *simOn == "postgres" || pg && *simOn != "sqlite" {
		s.store = simPostgres
		// The leadership's bound, which SQLite's lease plays: simLiveness counts it.
		s.cfg.LeaderTimeout = simLeaseTTL
		// One transaction in four stays open up to 3 s (SQLite has one writer: an
		// open transaction there holds everyone back).
		orng := rand.New(rand.NewPCG(seed, 4))
		for i := range s.txs {
			if orng.IntN(4) == 0 {
				s.txs[i].open = time.Duration(1+orng.IntN(3000)) * time.Millisecond
			}
		}
		// Half the PostgreSQL runs as a group. Not through a ledger: a group gives
		// each partition a ledger of its own (Kafka's transactional id per
		// partition), which the simulated broker does not have.
		if g := rand.New(rand.NewPCG(seed, 5)).IntN(2) == 0; *simGroup == "on" || g && *simGroup != "off" {
			s.group, s.ledger = true, false
			rrng := rand.New(rand.NewPCG(seed, 6))
			for i := range s.actions {
				s.actions[i].replace = rrng.IntN(3) == 0
			}
		}
	}
	return s
}

// simUUID is a version-4 UUID drawn from rng: the same seed, the same ids.
func simUUID(rng *rand.Rand) string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// simResult is what one run tells the test.
type simResult struct {
	hash    uint64
	failure string // "" when every check held
	trace   []string
	details []string
	reached map[string]int
}

func TestSimulation(t *testing.T) {
	seeds := []uint64{*simSeed}
	if *simSeed == 0 {
		n := *simRuns
		if n <= 0 {
			n = simRunsDefault()
		}
		seeds = seeds[:0]
		base := *simBase
		if base == 0 {
			base = uint64(time.Now().UnixNano()) // a new sample each run; a failure names its seed
		}
		for i := range n {
			seeds = append(seeds, base+uint64(i)*0x9e3779b9)
		}
	}
	reached := map[string]int{}
	replayed, differed := 0, 0
	for i, seed := range seeds {
		res := runSim(t, seed)
		if res.failure != "" {
			if len(seeds) == 1 {
				t.Logf("what the calls carried and returned:\n%s", strings.Join(res.details, "\n"))
			}
			tail := res.trace[max(0, len(res.trace)-150):]
			t.Fatalf("seed %d: %s\nreplay: go test ./relay -run 'TestSimulation$' -sim.seed=%d -v\nlast %d decisions:\n%s",
				seed, res.failure, seed, len(tail), strings.Join(tail, "\n"))
		}
		for k, v := range res.reached {
			reached[k] += v
		}
		if len(seeds) == 1 {
			t.Logf("seed %d: trace hash %016x, %d decisions", seed, res.hash, len(res.trace))
			t.Logf("trace:\n%s", strings.Join(res.trace, "\n"))
			t.Logf("what the calls carried and returned:\n%s", strings.Join(res.details, "\n"))
		}
		// Determinism, on a sample: the same seed, the same schedule.
		if len(seeds) == 1 || i%10 == 0 {
			again := runSim(t, seed)
			replayed++
			if again.hash != res.hash {
				differed++
				t.Logf("seed %d replayed with another trace (%016x, then %016x): %s", seed, res.hash, again.hash, firstDifference(res.trace, again.trace))
			}
		}
	}
	t.Logf("%d runs; %d replayed, %d with another trace; branches reached: %v", len(seeds), replayed, differed, reached)
	if len(seeds) >= 50 && *simOn == "" && *simGroup == "" { // a forced database or mode reaches only its own branches
		for _, b := range simBranches {
			if reached[b] == 0 {
				t.Errorf("no run reached %q: the simulator no longer explores it", b)
			}
		}
	}
}

// simBranches are the rare branches a CI sample must reach, or the simulator has
// stopped testing what it claims to.
var simBranches = []string{
	"takeover", "takeover-from-crashed-or-claiming", "crash-with-claim", "commit-outcome-unknown",
	"commit-after-caller-gave-up", "publish-answer-lost", "straggler", "settle", "dead-letter", "pause", "clock-step",
	"foreign-lock", "ledger-resume-marks",
	// The PostgreSQL model's server: runs on it, a claim's transaction ended by its
	// hold timeout, a leadership's session by idle_session_timeout.
	"pg-run", "pg-idle-in-transaction-ended", "pg-idle-session-ended",
	// Writers that do not serialize (PostgreSQL): a transaction committing after
	// later ones, an event of it published after a later one, marked late.
	"late-commit", "late-commit-passed", "late-commit-marked",
	// A group (PostgreSQL): runs as one, a partition's lease taken over (a new
	// epoch), a barrier before claiming a partition that changed hands, one that
	// waited for a row the previous owner's claim held, a paused member replaced
	// under its relay id while it lives on.
	"group-run", "group-lease-taken-over", "group-barrier", "pg-barrier-waited", "group-same-relay-id",
}

// Counted, too rare to require of a CI sample (about one run in 400): a dead letter
// moved by a process after another took its leadership ("dead-letter-after-term-lost");
// a ledger's commit fenced by a newer epoch ("ledger-fenced", about one in 100); on
// the PostgreSQL model, a new leader waiting for the old one's claims
// ("pg-leader-waited-for-claims", about one run in 200) and a statement waiting for a
// row lock ("pg-lock-waited", one in 70).

func firstDifference(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("first at decision %d: %q against %q", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("one trace is a prefix of the other (%d, %d decisions)", len(a), len(b))
}

// runSim runs one seed in a bubble of its own.
func runSim(t *testing.T, seed uint64) simResult {
	t.Helper()
	var res simResult
	dir := t.TempDir()
	// A run takes milliseconds: one that takes a minute is stuck (a goroutine that
	// never blocks stops virtual time), and says which seed before it dies.
	watchdog := time.AfterFunc(time.Minute, func() {
		debug.SetTraceback("all")
		panic(fmt.Sprintf("TestSimulation: seed %d is stuck (a goroutine never blocks); replay: go test ./relay -run 'TestSimulation$' -sim.seed=%d -v", seed, seed))
	})
	defer watchdog.Stop()
	synctest.Test(t, func(t *testing.T) {
		res = simulate(t, seed, filepath.Join(dir, "outbox.db"))
	})
	return res
}

// simulate plays seed's script and checks the outcome.
func simulate(t *testing.T, seed uint64, path string) simResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0))
	script := newSimScript(seed, rng)
	w := newSimWorld(seed, script.faultP)
	w.note("seed %d: %s, %d processes, faults %d‰, batch %d, %s, %d transactions, %d actions, ledger %v, group %v",
		seed, script.store, script.procs, script.faultP, script.cfg.BatchSize, script.cfg.Completion, len(script.txs), len(script.actions), script.ledger, script.group)
	ctx := context.Background()

	// The database, and the application writing through the writer.
	var backend simBackend
	var err error
	switch script.store {
	case simPostgres:
		backend, err = newPGBackend()
	default:
		backend, err = newSQLiteBackend(path)
	}
	if err != nil {
		t.Fatal(err)
	}
	appStore := backend.admin()

	var procs []*simProc
	nextID := 0
	// start starts a process; relayID, when given, is its group member id (a
	// replacement for a paused process, under the same id).
	start := func(relayID ...string) {
		p := &simProc{id: nextID}
		p.life, p.kill = context.WithCancel(ctx)
		nextID++
		inner, sever, closeStore := backend.open(p)
		p.store, p.sever = inner, sever
		cfg := script.cfg
		cfg.Rand = rand.NewPCG(seed, uint64(p.id)+1)
		cfg.Logger = slog.New(slog.DiscardHandler)
		var pub broker.Publisher = &simBroker{w: w, p: p, maxBytes: simMaxBytes}
		if script.ledger {
			pub = newSimLedgerBroker(pub.(*simBroker))
		}
		var store outboxdriver.Source = &simStore{w: w, p: p, inner: inner}
		if script.group {
			p.relayID = fmt.Sprint("r", p.id)
			if len(relayID) > 0 {
				p.relayID = relayID[0]
			}
			cfg.Group = &relay.GroupConfig{RelayID: p.relayID, LeaseTTL: simLeaseTTL}
			store = &simGroupStore{simStore: store.(*simStore), Admin: inner, group: inner.(outboxdriver.GroupStore)}
			w.reach("group-run")
		}
		r, err := relay.New(store, pub, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		p.stop = func() {
			cancel()
			if err := <-done; err != nil {
				w.note("p%d stopped with %v", p.id, err)
			}
			closeStore()
		}
		procs = append(procs, p)
		w.note("p%d started", p.id)
	}
	crash := func(p *simProc) {
		w.mu.Lock()
		p.dead = true
		if p.claims > 0 {
			w.reached["crash-with-claim"]++
		}
		var gone []*simCall
		w.pending = slices.DeleteFunc(w.pending, func(c *simCall) bool {
			if c.proc == p {
				gone = append(gone, c)
				return true
			}
			return false
		})
		w.mu.Unlock()
		if p.sever != nil {
			p.sever() // its connections die with it
		}
		for _, c := range gone {
			c.verdict <- simVerdict{fault: simRefused}
		}
		w.disruptions++
		w.note("p%d crashed", p.id)
		p.kill()
		p.stop()
	}
	live := func() []*simProc {
		return slices.DeleteFunc(slices.Clone(procs), func(p *simProc) bool { return p.dead })
	}
	for range script.procs {
		start()
	}

	// The fault phase: the script's transactions and actions at their times, calls
	// released one at a time in between.
	type restart struct{ at time.Time }
	var restarts []restart
	// held are the simLocks, until their release time.
	type held struct {
		until   time.Time
		release func()
	}
	var holds []held
	bad, good := map[string]bool{}, map[string][]string{} // good: per aggregate, in commit order
	txs, actions, locks := script.txs, script.actions, script.locks
	// opens are the transactions written and not yet ended, by when they end.
	var opens []simOpen
	for {
		quiesce()
		elapsed := time.Since(w.start)
		switch {
		case len(locks) > 0 && locks[0].at <= elapsed:
			l := locks[0]
			locks = locks[1:]
			span, release := backend.lock(ctx, live(), l)
			h := held{until: time.Now().Add(l.dur), release: release}
			if span != "" && span != "[]" {
				w.mu.Lock()
				w.reached["foreign-lock"]++
				w.mu.Unlock()
			}
			w.note("another session locks the rows %s for %v", span, l.dur)
			holds = append(holds, h)
			slices.SortStableFunc(holds, func(a, b held) int { return a.until.Compare(b.until) })
			continue
		case len(holds) > 0 && !holds[0].until.After(time.Now()):
			holds[0].release()
			holds = holds[1:]
			w.note("another session's locks released")
			continue
		case len(opens) > 0 && !opens[0].until.After(time.Now()):
			o := opens[0]
			opens = opens[1:]
			simEnd(t, w, o, bad)
			continue
		case len(txs) > 0 && txs[0].at <= elapsed:
			tx := txs[0]
			txs = txs[1:]
			o := simBegin(t, w, backend, tx, good)
			if tx.open == 0 {
				simEnd(t, w, o, bad)
				continue
			}
			opens = append(opens, o)
			slices.SortStableFunc(opens, func(a, b simOpen) int { return a.until.Compare(b.until) })
			continue
		case len(actions) > 0 && actions[0].at <= elapsed:
			a := actions[0]
			actions = actions[1:]
			if l := live(); len(l) > 0 {
				p := l[a.proc%len(l)]
				switch a.kind {
				case simCrash:
					crash(p)
					restarts = append(restarts, restart{at: time.Now().Add(a.dur)})
				case simPause:
					w.mu.Lock()
					p.pausedUntil = time.Now().Add(a.dur)
					w.reached["pause"]++
					w.disruptions++
					w.mu.Unlock()
					w.note("p%d paused for %v", p.id, a.dur)
					if a.replace && script.group {
						// An orchestrator gives up on the hung process and starts
						// another under its relay id, while it lives on.
						w.reach("group-same-relay-id")
						start(p.relayID)
					}
				case simClockStep:
					p.step.Add(int64(a.dur))
					w.mu.Lock()
					w.reached["clock-step"]++
					w.disruptions++
					w.mu.Unlock()
					w.note("p%d's wall clock stepped by %v", p.id, a.dur)
				}
			}
			continue
		case len(restarts) > 0 && !restarts[0].at.After(time.Now()):
			restarts = restarts[1:]
			start()
			continue
		}
		if elapsed >= simFaultPhase && len(txs) == 0 && len(opens) == 0 {
			break
		}
		if w.releaseOne() {
			continue
		}
		next := w.start.Add(simFaultPhase)
		if len(opens) > 0 && !next.After(time.Now()) { // a transaction still open past the phase
			next = opens[0].until
		}
		if len(txs) > 0 {
			next = w.start.Add(txs[0].at)
		}
		if len(opens) > 0 && opens[0].until.Before(next) {
			next = opens[0].until
		}
		if len(actions) > 0 && w.start.Add(actions[0].at).Before(next) {
			next = w.start.Add(actions[0].at)
		}
		if len(restarts) > 0 && restarts[0].at.Before(next) {
			next = restarts[0].at
		}
		if len(locks) > 0 && w.start.Add(locks[0].at).Before(next) {
			next = w.start.Add(locks[0].at)
		}
		if len(holds) > 0 && holds[0].until.Before(next) {
			next = holds[0].until
		}
		w.idle(next)
	}
	for _, h := range holds {
		h.release()
	}

	// The faults stop: hung calls die, pauses end, the crashed come back.
	w.mu.Lock()
	w.healed = true
	close(w.heal)
	for _, p := range procs {
		p.pausedUntil = time.Time{}
		p.step.Store(0) // the clocks agree again
	}
	w.mu.Unlock()
	for range restarts {
		start()
	}
	if len(live()) == 0 {
		start()
	}
	w.note("healed")
	wantDead := 0
	for range bad {
		wantDead++
	}
	deadline := time.Now().Add(simLiveness(script.cfg))
	failure := ""
	lastLook := time.Time{}
	for {
		quiesce()
		if w.releaseOne() {
			continue
		}
		if time.Since(lastLook) >= 50*time.Millisecond {
			lastLook = time.Now()
			st, err := appStore.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Unpublished == 0 && int(st.Dead) == wantDead {
				break
			}
			if time.Now().After(deadline) {
				failure = fmt.Sprintf("liveness: %v after the faults stopped, %d events unpublished and %d dead (want 0 and %d)",
					simLiveness(script.cfg), st.Unpublished, st.Dead, wantDead)
				if st.Unpublished == 0 { // all out: say which event is not where it belongs
					if f := simCheck(ctx, w, appStore, bad, good); f != "" {
						failure = f
					}
				}
				break
			}
		}
		w.idle(lastLook.Add(50 * time.Millisecond))
	}
	for _, p := range live() {
		crash(p)
	}
	w.bg.Wait()
	if failure == "" {
		failure = simCheck(ctx, w, appStore, bad, good)
	}
	if failure == "" {
		failure = simDuplicates(w, script.cfg.BatchSize, script.ledger)
	}
	if failure != "" {
		backend.dump(w)
	}
	for k, v := range backend.reached() {
		w.reached[k] += v
	}
	backend.close()
	return simResult{hash: w.hash, failure: failure, trace: w.trace, details: w.details, reached: w.reached}
}

// simOpen is a transaction of the script, written and not yet ended.
type simOpen struct {
	tx    simTx
	until time.Time
	end   func(rollback bool) error
}

// simBegin writes one transaction of the script through the writer, and adds its good
// events to good, per aggregate in write order (the order of their seqs).
func simBegin(t *testing.T, w *simWorld, backend simBackend, tx simTx, good map[string][]string) simOpen {
	t.Helper()
	evs := make([]outbox.Event, len(tx.events))
	for i := range tx.events {
		evs[i] = tx.events[i].ev
	}
	end, err := backend.begin(context.Background(), evs)
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	for _, e := range tx.events {
		if !e.bad {
			good[e.ev.AggregateID] = append(good[e.ev.AggregateID], e.ev.ID)
		}
	}
	w.mu.Unlock()
	if tx.open > 0 {
		w.note("wrote %d events, open for %v", len(evs), tx.open)
	}
	return simOpen{tx: tx, until: time.Now().Add(tx.open), end: end}
}

// simEnd commits or rolls back a transaction of the script.
func simEnd(t *testing.T, w *simWorld, o simOpen, bad map[string]bool) {
	t.Helper()
	if err := o.end(o.tx.rollback); err != nil {
		t.Fatal(err)
	}
	if o.tx.rollback {
		w.mu.Lock()
		for _, e := range o.tx.events {
			w.rolledBack[e.ev.ID] = true
		}
		w.mu.Unlock()
		w.note("rolled back %d events", len(o.tx.events))
		return
	}
	w.mu.Lock()
	now := time.Now()
	var line []string
	for _, e := range o.tx.events {
		w.committed[e.ev.ID] = now
		if e.bad {
			bad[e.ev.ID] = true
		}
		line = append(line, e.ev.AggregateID+"/"+shortID(e.ev.ID))
	}
	w.mu.Unlock()
	if o.tx.open > 0 {
		w.reach("late-commit")
	}
	w.note("committed %v", line)
}

// simDuplicates bounds the events sent again: each disruption (a faulted call, a
// crash, a pause) may make the relays send again what was in flight then, at most
// the batch in hand, the one prefetched, a slow key's and the one a paused process
// still holds: four batches. Through a ledger, none.
func simDuplicates(w *simWorld, batch int, ledger bool) string {
	sent := map[string]bool{}
	dups := 0
	for _, m := range w.taken {
		if sent[m.id] {
			dups++
		}
		sent[m.id] = true
	}
	if ledger && dups > 0 {
		return fmt.Sprintf("%d events reached the broker twice through its ledger (exactly once)", dups)
	}
	if bound := 4 * batch * (w.disruptions + 1); dups > bound {
		return fmt.Sprintf("%d events sent again after %d disruptions: at most %d expected (four batches of %d each, and once more)", dups, w.disruptions, bound, batch)
	}
	return ""
}

// simInOrder checks the first delivery m against the events written before it in
// its aggregate (ids, in write order): each must have gone first, unless it was not
// committed yet when m's claim read the table (a late commit: no relay can see it).
// A late commit that the same process publishes after the broker took a later event
// of its aggregate must go out marked outbox-late: committed-late.
func simInOrder(w *simWorld, m simTaken, ids []string, pos map[string]int, delivered map[string]bool) string {
	for _, earlier := range ids[:pos[m.id]] {
		at, committed := w.committed[earlier]
		if !committed || delivered[earlier] {
			continue // rolled back, or out already
		}
		// The claim m went out from: the process's last claim of it before.
		var claimed time.Time
		for _, c := range w.claimed[simSent{m.proc, m.id}] {
			if !c.After(m.at) {
				claimed = c
			}
		}
		if !claimed.IsZero() && at.After(claimed) {
			w.reached["late-commit-passed"]++
			continue
		}
		return fmt.Sprintf("aggregate %s: %s (#%d) reached the broker (p%d, at %v) before %s (#%d) ever had",
			m.key, shortID(m.id), pos[m.id], m.proc, m.at.Sub(w.start), shortID(earlier), pos[earlier])
	}
	if m.late == wire.LateCommitted {
		w.reached["late-commit-marked"]++
		return ""
	}
	for _, later := range ids[pos[m.id]+1:] {
		if acked, ok := w.acked[simSent{m.proc, later}]; ok && acked.Before(w.committed[m.id]) {
			return fmt.Sprintf("aggregate %s: %s (#%d) committed late, after p%d had published %s (#%d), and went out without %s: %s",
				m.key, shortID(m.id), pos[m.id], m.proc, shortID(later), pos[later], wire.HeaderLate, wire.LateCommitted)
		}
	}
	return ""
}

// simCheck checks the broker's log and the dead letters against what was committed.
func simCheck(ctx context.Context, w *simWorld, store outboxdriver.Store, bad map[string]bool, good map[string][]string) string {
	pos := map[string]int{}
	for _, ids := range good {
		for i, id := range ids {
			pos[id] = i
		}
	}
	delivered := map[string]bool{}
	for _, m := range w.taken {
		at, committed := w.committed[m.id]
		switch {
		case w.rolledBack[m.id]:
			return fmt.Sprintf("rolled-back event %s reached the broker (p%d)", shortID(m.id), m.proc)
		case !committed:
			return fmt.Sprintf("message %s reached the broker, but no committed event has that id (p%d)", m.id, m.proc)
		case m.at.Before(at):
			return fmt.Sprintf("event %s reached the broker before its commit (p%d)", shortID(m.id), m.proc)
		case bad[m.id]:
			return fmt.Sprintf("bad event %s reached the broker (p%d)", shortID(m.id), m.proc)
		}
		if !delivered[m.id] {
			if f := simInOrder(w, m, good[m.key], pos, delivered); f != "" {
				return f
			}
		}
		delivered[m.id] = true
	}
	for _, agg := range slices.Sorted(maps.Keys(good)) {
		for _, id := range good[agg] {
			if _, committed := w.committed[id]; committed && !delivered[id] {
				return fmt.Sprintf("aggregate %s: event %s was committed but never reached the broker", agg, shortID(id))
			}
		}
	}
	dead, err := store.ListDead(ctx, nil)
	if err != nil {
		return err.Error()
	}
	isDead := map[string]bool{}
	for _, d := range dead {
		if !bad[d.ID] || !strings.Contains(d.Error, "exceeds the limit") {
			return fmt.Sprintf("dead letter %s (bad: %v): %q", shortID(d.ID), bad[d.ID], d.Error)
		}
		isDead[d.ID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(bad)) {
		if !isDead[id] {
			return fmt.Sprintf("bad event %s is not a dead letter", shortID(id))
		}
	}
	return ""
}

// simPlantedBugs are the bugs planted under the simbug build tag (internal/simbug):
// each must make TestSimulation fail within simSliceBugRuns seeds of a fixed sample.
var simPlantedBugs = []struct{ name, what string }{
	{"sequence-no-holdback", "broker.Sequence sends a key's later messages after an earlier one failed"},
	{"unavailable-published", "the relay counts a message the broker never answered as published"},
	{"dead-on-unavailable", "the relay moves an event to the dead letters because the broker was unreachable"},
	{"keep-prefetched", "after a refusal, the relay publishes the batch it prefetched (later events of the refused key)"},
	{"no-mark-wait", "after a refusal, the relay claims again before the failure's write-back landed"},
	{"message-id", "the relay sends each attempt under a new message id (no dedup id)"},
	{"straggler-no-skip", "a slow key's later events are claimed while its answer is still out"},
	{"settle-all-published", "a slow key's write-back records every row as published, refused ones too"},
	{"sqlite-pass-failing", "the SQLite claim takes events behind a failing event of their aggregate"},
	{"dead-marked-published", "the SQL drivers' shared write (SQLite's here) marks a dead letter published instead of moving it"},
	{"heads-off", "a claim takes an event while another session holds an earlier one of its aggregate (the head rule removed)"},
	{"ledger-marked-early", "the relay tells a ledger a batch is marked though its mark failed"},
	{"ledger-fence-ignored", "the relay keeps its term after its ledger was fenced (it never resumes)"},
	{"late-unmarked", "the relay sends an event that committed after a later one of its aggregate went out without outbox-late: committed-late"},
}

// The CI slice: seeds of the clean build, then seeds of each planted bug (a fixed
// sample, so that "caught" does not depend on luck), without the race detector.
const (
	simSliceRuns    = 1000
	simSliceBugRuns = 400
	simSliceBugBase = 1
)

// TestSimulationSlice is the simulator's CI slice: it builds this package's tests
// with the simbug tag and without the race detector, runs simSliceRuns seeds of the
// real code on one CPU, then each planted bug, which must be caught.
func TestSimulationSlice(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the simulator's slice builds and runs a test binary of its own")
	}
	bin := filepath.Join(t.TempDir(), "relay-simbug.test")
	build := exec.Command("go", "test", "-c", "-tags", "simbug", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build with the simbug tag: %v\n%s", err, out)
	}
	run := func(bug string, runs int, base uint64) (string, error) {
		cmd := exec.Command(bin, "-test.run", "^TestSimulation$", "-test.count=1", "-test.v",
			fmt.Sprintf("-sim.runs=%d", runs), fmt.Sprintf("-sim.base=%d", base))
		cmd.Env = append(os.Environ(), "OUTBOX_SIMBUG="+bug, "GOMAXPROCS=1")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("", simSliceRuns, 0)
	if err != nil {
		t.Fatalf("the simulator failed on the real code: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, " runs; ") {
			t.Logf("the real code:%s", line[strings.Index(line, ": ")+1:])
		}
	}
	for _, bug := range simPlantedBugs {
		t.Run(bug.name, func(t *testing.T) {
			out, err := run(bug.name, simSliceBugRuns, simSliceBugBase)
			if err == nil {
				t.Fatalf("planted bug %q (%s) was not caught in %d seeds", bug.name, bug.what, simSliceBugRuns)
			}
			i := strings.Index(out, "seed ")
			if i < 0 || !strings.Contains(out, "replay:") {
				t.Fatalf("planted bug %q failed the run without naming a seed to replay:\n%s", bug.name, out)
			}
			t.Logf("caught: %s", strings.SplitN(out[i:], "\n", 2)[0])
		})
	}
}
