package relay

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/failpoint"
	"github.com/outboxd/outbox/internal/safetext"
	"github.com/outboxd/outbox/internal/simbug"
	"github.com/outboxd/outbox/outboxdriver"
)

// Relay publishes committed outbox rows. Build it with New, run it with Run or
// Start/Stop.
type Relay struct {
	store outboxdriver.Source
	pub   broker.Publisher
	// ledger is pub when it is a broker.Ledger (ledger.go).
	ledger broker.Ledger
	// units are a group member's ledgers, one per partition (ledger.go); nil unless
	// ledger is set and the relay is in a group.
	units *units
	cfg   Config
	tmpl  *broker.Template
	esc   func(string) string
	log   *slog.Logger
	late  *lateMarks
	// jitter draws every random wait (Config.Rand).
	jitter jitter

	stats stats

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	runErr  error
	started bool
}

type stats struct {
	published, failed, batches, dead, cleaned, late atomic.Int64
	claims, standby                                 atomic.Int64
	brokerDownSince                                 atomic.Int64 // unix nanos; 0 while the broker answers
	partitions                                      atomic.Int64 // partitions owned in a group
	leader                                          atomic.Bool
}

// Stats are counters since the relay was built.
type Stats struct {
	Published int64 // messages the broker acknowledged
	Failed    int64 // messages the broker did not take (each attempt)
	Batches   int64 // batches published
	Dead      int64 // events this relay moved to the dead letters
	Cleaned   int64 // published rows deleted after the retention
	// Late counts events sent marked late (outbox-late: committed-late): their
	// transaction committed after a later event of their aggregate was published.
	Late int64
	// BrokerDownSince is when the broker became unreachable (zero while it answers).
	BrokerDownSince time.Time
	Leader          bool // whether this relay is the active one now (a group member: active)
	Partitions      int  // partitions this group member owns now
	// Claims counts the store's answers to the relay's claims, empty ones too: each is
	// a turn of the publishing loop. A test waits for turns, not for time, before it
	// says something did not happen (an event held back stays held across them).
	Claims int64
	// Standby counts the times this relay tried to become active and found another
	// relay active on the table (a relay outside the group, for a group member).
	Standby int64
}

// New returns a relay reading from store (a table store, or a CDC source) and
// publishing to pub.
func New(store outboxdriver.Source, pub broker.Publisher, cfg *Config) (*Relay, error) {
	if store == nil {
		return nil, errors.New("relay: store is nil")
	}
	if pub == nil {
		return nil, errors.New("relay: publisher is nil")
	}
	c, tmpl, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Relay{store: store, pub: pub, cfg: c, tmpl: tmpl, log: c.Logger, late: newLateMarks(), jitter: newJitter(c.Rand)}
	if e, ok := pub.(broker.TopicEscaper); ok {
		r.esc = e.EscapeTopicToken
	}
	r.ledger, _ = pub.(broker.Ledger)
	if err := r.checkCapabilities(); err != nil {
		return nil, err
	}
	if err := r.checkLedger(); err != nil {
		return nil, err
	}
	if ul, ok := r.ledger.(broker.UnitLedger); ok && c.Group != nil {
		r.units = newUnits(ul.Unit)
	}
	if err := r.checkTemplate(); err != nil {
		return nil, err
	}
	return r, nil
}

// checkCapabilities refuses a configuration the store cannot honour, at
// construction and in one error: found per event at run time, it would fail (and
// republish) every batch.
func (r *Relay) checkCapabilities() error {
	caps := r.store.Capabilities()
	var missing []string
	if !caps.Completes(r.cfg.Completion) {
		missing = append(missing, fmt.Sprintf("completion %q (it completes with %v)", r.cfg.Completion, caps.Completions))
	}
	if _, ok := r.store.(outboxdriver.GroupStore); r.cfg.Group != nil && !ok {
		missing = append(missing, "several active relays (Group)")
	}
	if cr, ok := r.cfg.Router.(ColumnRouter); ok && len(cr.Columns()) > 0 && !caps.Columns {
		missing = append(missing, fmt.Sprintf("custom columns %v (the router reads them)", cr.Columns()))
	}
	if len(missing) > 0 {
		return fmt.Errorf("relay: the store cannot honour %s: %w", strings.Join(missing, ", "), outboxdriver.ErrNotSupported)
	}
	return nil
}

// checkTemplate renders the topic template with sample values and asks the publisher
// whether it takes the result: a template that can only make bad topics is a
// configuration error now, not a dead letter for every event later.
func (r *Relay) checkTemplate() error {
	v, ok := r.pub.(broker.TopicValidator)
	if !ok || r.cfg.Router != nil {
		return nil
	}
	topic := r.tmpl.Execute(broker.TopicFields{AggregateType: "sample", Type: "Sample"}, r.esc)
	if err := v.ValidateTopic(topic); err != nil {
		return fmt.Errorf("relay: topic template %q: %w", r.cfg.TopicTemplate, err)
	}
	return nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Published: r.stats.published.Load(),
		Failed:    r.stats.failed.Load(),
		Batches:   r.stats.batches.Load(),
		Dead:      r.stats.dead.Load(),
		Cleaned:   r.stats.cleaned.Load(),
		Late:      r.stats.late.Load(),
		BrokerDownSince: func() time.Time {
			if ns := r.stats.brokerDownSince.Load(); ns != 0 {
				return time.Unix(0, ns)
			}
			return time.Time{}
		}(),
		Leader:     r.stats.leader.Load(),
		Partitions: int(r.stats.partitions.Load()),
		Claims:     r.stats.claims.Load(),
		Standby:    r.stats.standby.Load(),
	}
}

// Start runs the relay in the background until Stop or until ctx ends.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("relay: already started")
	}
	r.started = true
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		err := r.Run(ctx)
		r.mu.Lock()
		r.runErr = err
		r.mu.Unlock()
	}()
	return nil
}

// Stop asks the relay to stop, waits for it to drain in-flight work (or for ctx to
// end), and returns the error that ended it, if any. It is safe to call twice and
// before Start.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("relay: stop: %w", ctx.Err())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runErr
}

// Run relays until ctx ends, then drains in-flight work and returns nil. While another
// relay is active it waits as a hot standby and takes over when that one goes away.
// It returns early only with an error an operator must fix
// (outboxdriver.ErrNeedsOperator, such as a lost replication slot).
func (r *Relay) Run(ctx context.Context) error {
	if r.cfg.Group != nil {
		return r.runGroup(ctx)
	}
	bo := r.newBackoff("leadership")
	standby := false // said once per wait, not every retry
	for ctx.Err() == nil {
		acquired := time.Now()
		actx, cancel := r.dbCtx(ctx)
		lead, err := r.store.AcquireLeadership(actx, &outboxdriver.LeadershipParams{Timeout: r.cfg.LeaderTimeout})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, outboxdriver.ErrNeedsOperator) {
				r.log.Error("relay: stopping", "err", err)
				return err
			}
			r.log.Error("relay: cannot reach the database to take leadership", "err", err)
			sleep(ctx, bo.next())
			continue
		}
		bo.reset()
		if lead == nil {
			r.stats.standby.Add(1)
			if !standby {
				standby = true
				r.log.Info("relay: standby: another relay is active; taking over when it goes", "retry_every", r.cfg.LeaderRetry)
			}
			sleep(ctx, r.cfg.LeaderRetry)
			continue
		}
		standby = false
		r.log.Info("relay: active", "table_lock", "acquired")
		r.stats.leader.Store(true)
		r.hook("LeaderChanged", func(h Hooks) { h.LeaderChanged(true) })
		t := newSingleTerm(lead, r.cfg.LeaderTimeout, r.cfg.LeaderCheck, acquired)
		termCtx, endTerm := context.WithCancel(ctx)
		hbDone := make(chan struct{})
		// A lost term is said at once (stats, hooks), though the pipeline may still
		// be unwinding from a call on a dead connection: it publishes nothing more.
		lost := func() { endTerm(); r.notLeader() }
		go func() { defer close(hbDone); t.heartbeat(termCtx, r.log, lost) }()
		if err = r.resumeLedger(termCtx); err == nil {
			err = r.lead(termCtx, t)
		}
		endTerm()
		<-hbDone
		if err == nil && ctx.Err() == nil {
			err = t.check(ctx, nil) // the heartbeat ended the term
		}
		r.notLeader()
		r.releaseLock(ctx, lead)
		if errStop(err) && ctx.Err() == nil {
			r.log.Error("relay: stopping", "err", err)
			return err
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("relay: stepped down", "err", err)
			sleep(ctx, bo.next())
		}
	}
	return nil
}

// notLeader records that this relay no longer leads, once per term.
func (r *Relay) notLeader() {
	if r.stats.leader.CompareAndSwap(true, false) {
		r.hook("LeaderChanged", func(h Hooks) { h.LeaderChanged(false) })
	}
}

// hook calls fn with the configured hooks, if any. A panicking hook (a metrics
// exporter choking on a row's bytes) is logged and survived: observing the relay must
// never stop it, and a crash before the mark would publish the batch again forever.
func (r *Relay) hook(name string, fn func(Hooks)) {
	if r.cfg.Hooks == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("relay: hook panicked; ignored", "hook", name, "panic", ErrorText(fmt.Sprint(p), maxErrorBytes))
		}
	}()
	fn(r.cfg.Hooks)
}

// releaseLock gives a table lock back, even when ctx has ended.
func (r *Relay) releaseLock(ctx context.Context, l outboxdriver.Leadership) {
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = l.Release(relCtx)
}

// claimResult is a claim in progress or done.
type claimResult struct {
	claim outboxdriver.Claim
	err   error
}

// startClaim claims the next batch in the background, under work; the claim is kept
// alive (keepClaim) until it is completed or released, or the term (termCtx) ends.
func (r *Relay) startClaim(termCtx, ctx context.Context, t term, skip []outboxdriver.Aggregate, ahead []int64) chan claimResult {
	ch := make(chan claimResult, 1)
	p := t.claimParams(r.cfg.BatchSize) // taken now: the term may change before the claim runs
	p.MaxBytes = max(r.cfg.MaxBatchBytes, 0)
	p.Skip, p.Ahead = skip, ahead
	p.FlowPastDeadLetters = r.cfg.FlowPastDeadLetters
	if cr, ok := r.cfg.Router.(ColumnRouter); ok {
		p.Columns = cr.Columns()
	}
	go func() {
		cctx, cancel := r.dbCtx(ctx)
		defer cancel()
		start := time.Now()
		c, err := r.store.Claim(cctx, p)
		if err == nil {
			took := time.Since(start)
			r.stats.claims.Add(1)
			r.hook("Claimed", func(h Hooks) {
				if clh, ok := h.(ClaimHooks); ok {
					clh.Claimed(len(c.Rows()), took)
				}
			})
			c = r.keepClaim(termCtx, c, p.HoldTimeout)
		}
		ch <- claimResult{c, err}
	}()
	return ch
}

// lead runs the publishing pipeline while this relay holds leadership. The broker
// stage is sequential (batch n+1 is sent only after every answer for batch n, and
// after batch n's mark committed), so a key's messages reach the broker in write order
// and a crash republishes at most one batch; the claim of the next batch overlaps with
// the publishing and marking of the current one.
func (r *Relay) lead(ctx context.Context, t term) error {
	p := r.newPipeline(ctx, t)
	defer p.close()
	for ctx.Err() == nil {
		p.land(false)
		if err := p.checkTerm(); err != nil {
			p.dropPrefetched()
			return err
		}
		cr, claimWait := p.claim()
		switch {
		case cr.err != nil:
			r.log.Error("relay: claim failed", "err", cr.err)
			r.waitFor(ctx, p.wake, p.bo.next())
		case len(cr.claim.Rows()) == 0:
			p.idle()
		default:
			p.batch(cr, claimWait)
		}
		if p.fenced != nil {
			p.dropPrefetched()
			return p.fenced
		}
	}
	p.dropPrefetched()
	return nil
}

// pipeline is one term's publishing pipeline: the claim prefetched behind the batch
// in hand, the last batch's write-back, the backoff, and the wake-up state.
type pipeline struct {
	r         *Relay
	t         term
	ctx       context.Context // the term
	work      context.Context // the batch in hand's: outlives ctx by DrainTimeout
	endWork   func()
	wake      chan struct{}
	stopBg    func()
	next      chan claimResult // the prefetched claim, if any
	fly       flying           // the slow keys' rows still out (flight.go)
	inHand    []int64          // the seqs of the batch in hand
	marking   []sentAhead      // the batches whose write-back may be under way
	marks     sync.WaitGroup   // the last batch's write-back
	markFail  atomic.Bool      // it failed: its rows go out again
	bo        *backoff
	lastCheck time.Time
	linger    bool  // the last empty pass was woken by a notification
	fenced    error // a batch came back fenced (ledger.go): the term ends
}

func (r *Relay) newPipeline(ctx context.Context, t term) *pipeline {
	p := &pipeline{r: r, t: t, ctx: ctx, wake: make(chan struct{}, 1), bo: r.newBackoff("pipeline"), lastCheck: time.Now(),
		fly: flying{keys: map[outboxdriver.Aggregate]bool{}, parts: map[int]int{}, landed: make(chan *straggler, r.cfg.BatchSize)}}
	p.work, p.endWork = r.drainContext(ctx)
	p.stopBg = r.background(ctx, p.wake)
	return p
}

// close waits for the last write-back and the slow keys' answers, and stops the
// term's background work.
func (p *pipeline) close() {
	p.marks.Wait()
	p.land(true)
	p.dropPrefetched()
	p.stopBg()
	p.endWork()
}

// checkTerm proves, every term interval, that the term still holds; a term that may
// change what this relay owns is checked with nothing in hand.
func (p *pipeline) checkTerm() error {
	if time.Since(p.lastCheck) < p.t.interval() {
		return nil
	}
	if p.t.drainsBeforeCheck() {
		p.dropPrefetched()
		p.marks.Wait()
	}
	if err := p.t.check(p.work, p.fly.partitions()); err != nil {
		return err
	}
	p.lastCheck = time.Now()
	return nil
}

// claim returns the prefetched claim, or claims now, and how long it waited.
func (p *pipeline) claim() (claimResult, time.Duration) {
	if p.next == nil {
		p.prefetch()
	}
	start := time.Now()
	cr := <-p.next
	p.next = nil
	return cr, time.Since(start)
}

func (p *pipeline) prefetch() { p.next = p.r.startClaim(p.ctx, p.work, p.t, p.fly.skip(), p.ahead()) }

// sentAhead is a batch whose write-back ends when ended is closed.
type sentAhead struct {
	seqs  []int64
	ended <-chan struct{}
}

// ahead is what a claim made now may pass (ClaimParams.Ahead): the rows of the batch
// in hand and of the write-backs under way, which reach the broker, acknowledged and
// marked, before any row of that claim does; or the claim is given back (a failure,
// a failed mark, a lost lease).
func (p *pipeline) ahead() []int64 {
	live := p.marking[:0]
	n := len(p.inHand)
	for _, b := range p.marking {
		select {
		case <-b.ended:
		default:
			live, n = append(live, b), n+len(b.seqs)
		}
	}
	clear(p.marking[len(live):])
	p.marking = live
	if n == 0 {
		return nil
	}
	out := make([]int64, 0, n)
	out = append(out, p.inHand...)
	for _, b := range p.marking {
		out = append(out, b.seqs...)
	}
	return out
}

func seqs(rows []outboxdriver.Row) []int64 {
	out := make([]int64, len(rows))
	for i := range rows {
		out[i] = rows[i].Seq
	}
	return out
}

// dropPrefetched gives the prefetched claim's rows back, if there is one.
func (p *pipeline) dropPrefetched() {
	p.r.releasePending(p.work, p.next)
	p.next = nil
}

// release gives a claim's rows back unchanged.
func (p *pipeline) release(c outboxdriver.Claim) {
	ctx, cancel := p.r.dbCtx(p.work)
	defer cancel()
	_ = c.Release(ctx)
}

// idle waits for work after an empty claim: the poll interval, or a notification (and
// after a notification-driven pass, a shorter linger for debounced writes).
func (p *pipeline) idle() {
	d := p.r.cfg.PollInterval
	if p.linger {
		d, p.linger = min(d, p.r.cfg.NotifyLinger), false
	}
	if p.r.waitFor(p.ctx, p.wake, d) {
		p.linger = true
	}
}

// batch publishes a claimed batch and writes its outcome back.
func (p *pipeline) batch(cr claimResult, claimWait time.Duration) {
	r, rows := p.r, cr.claim.Rows()
	failpoint.Hit(failpoint.RelayAfterClaim)
	p.inHand = seqs(rows)
	defer func() { p.inHand = nil }()
	// A claim cut short by MaxBatchBytes may still lock rows it did not read: no
	// prefetch past them, and the next claim only after this one's mark.
	cut := r.cfg.MaxBatchBytes > 0 && payloadBytes(rows) >= r.cfg.MaxBatchBytes
	full := len(rows) == r.cfg.BatchSize && !cut
	if full && p.ctx.Err() == nil {
		p.prefetch() // while this batch is on the wire
	}
	if !p.t.publishable(rows) {
		// A lease ran out (a pause, a slow database): another relay may own these
		// rows now. Publish nothing; check the term again first.
		r.log.Warn("relay: partition lease expired before publishing; batch given back", "rows", len(rows))
		p.release(cr.claim)
		p.dropPrefetched()
		p.lastCheck = time.Time{}
		return
	}
	// The previous batch's mark must have landed before this one goes out: after a
	// crash at most one batch (this one) is published again. (Letting them overlap
	// measured no faster here: docs/benchmarks.md.)
	p.marks.Wait()
	if p.markFail.Swap(false) {
		// The last write-back failed: its rows go out again. Back off as for a
		// failed claim, so a database that refuses it is not hammered.
		p.release(cr.claim)
		p.dropPrefetched()
		r.waitFor(p.ctx, nil, p.bo.next())
		return
	}
	// Rows behind a slow key's, still out, wait (claimed before it was found slow).
	if rows, _ = p.fly.held(rows); len(rows) == 0 {
		p.release(cr.claim)
		return
	}
	f := r.startPublish(p.work, rows)
	s := p.await(f, cr.claim)
	var (
		results []broker.Result
		pubTime time.Duration // the whole batch's (0 while a slow key's answers are out)
	)
	if s == nil {
		results, pubTime = f.results, f.took
	} else {
		rows, results = s.answered()
	}
	if p.fenced = fencedErr(results); p.fenced != nil && simbug.On("ledger-fence-ignored") {
		p.fenced = nil
	}
	if p.fenced != nil {
		r.log.Warn("relay: the publisher was fenced; the term ends, to resume it", "err", p.fenced)
	}
	params, failed, unavailable := r.outcome(rows, results)
	r.count(params, failed, unavailable)
	marked := r.writeBack(p.work, &p.marks, &p.markFail, cr.claim, params, len(rows), claimWait, pubTime)
	p.marking = append(p.marking, sentAhead{seqs: p.inHand, ended: marked})
	if s != nil {
		s.marks = marked
		r.log.Info("relay: slow keys left in flight; the rest of the batch goes on", "keys", len(s.keys), "rows", len(s.idx))
	}
	if cut {
		p.marks.Wait()
	}
	p.after(results, failed, unavailable, full)
}

// after decides what follows a published batch: the next claim at once, or, after a
// failure, the failing rows' marks first and, if the broker is unreachable, a backoff.
func (p *pipeline) after(results []broker.Result, failed int, unavailable, full bool) {
	r := p.r
	if failed == 0 {
		p.bo.reset()
		if !full {
			// Pick up a pending wake-up, then claim again. The linger a notification
			// armed stays armed until the relay idles: a writer debounces its
			// notifications, so the last commits of a burst may have none, and the
			// relay must look once more after NotifyLinger, not a whole PollInterval.
			if r.waitFor(p.ctx, p.wake, 0) {
				p.linger = true
			}
		}
		return
	}
	// A failure: drop the prefetched batch (it may hold later events of a failed key)
	// and let the marks land, so the next claim sees the failing rows and leaves their
	// aggregates' later events alone.
	if !simbug.On("keep-prefetched") {
		p.dropPrefetched()
	}
	if !simbug.On("no-mark-wait") {
		p.marks.Wait()
	}
	if !unavailable {
		// Only messages were refused: each waits for its own retry time; every other
		// aggregate goes on at once.
		p.bo.reset()
		r.log.Warn("relay: broker refused messages", "failed", failed, "of", len(results), "first_error", firstErr(results))
		return
	}
	// The broker is unreachable: back off the whole publisher. No attempt is spent.
	d := p.bo.next()
	r.log.Warn("relay: broker unavailable; backing off", "failed", failed, "of", len(results),
		"first_error", firstErr(results), "retry_in", d)
	r.waitFor(p.ctx, nil, d)
}

// drainContext returns the context the batch in hand runs under: it outlives ctx by
// DrainTimeout, so a stop finishes (publishes and marks) what was claimed.
func (r *Relay) drainContext(ctx context.Context) (context.Context, func()) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.DrainTimeout, cancel)
		context.AfterFunc(work, func() { t.Stop() })
	})
	return work, func() { stop(); cancel() }
}

// background runs, while the relay leads, the notification listener (feeding wake)
// and the cleanup of published rows; the returned func stops them and waits.
func (r *Relay) background(ctx context.Context, wake chan<- struct{}) func() {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.listen(ctx, wake) }()
	if r.cfg.Retention > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); r.cleanup(ctx) }()
	}
	return func() { cancel(); wg.Wait() }
}

// keepClaim keeps a claim's hold alive from the moment it is made until it is
// completed or released: a publish slower than the claim's HoldTimeout (a receiver
// slower than the leadership bound) must not let the database end the claim in hand,
// or the one prefetched behind it, free their rows for the next claim, and have the
// batch sent again and again. It proves only that this relay runs and reaches the
// database, which is what the hold bounds, and it stops with the term (ctx): a relay
// that lost its leadership holds nothing past it.
func (r *Relay) keepClaim(ctx context.Context, c outboxdriver.Claim, hold time.Duration) outboxdriver.Claim {
	k, ok := c.(outboxdriver.ClaimKeeper)
	if !ok || hold <= 0 || len(c.Rows()) == 0 {
		return c
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(hold / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				kctx, kcancel := context.WithTimeout(ctx, hold/3)
				err := k.KeepAlive(kctx)
				kcancel()
				if err != nil && ctx.Err() == nil {
					r.log.Warn("relay: could not keep a claim alive", "err", err)
					return
				}
			}
		}
	}()
	return &keptClaim{Claim: c, stop: func() { cancel(); <-done }}
}

// keptClaim is a claim kept alive until it is completed or released.
type keptClaim struct {
	outboxdriver.Claim
	once sync.Once
	stop func()
}

func (k *keptClaim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	k.once.Do(k.stop)
	return k.Claim.Complete(ctx, p)
}

// Settle forwards to the claim's Settler (a claim completed in parts).
func (k *keptClaim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	s, ok := k.Claim.(outboxdriver.Settler)
	if !ok {
		return errNoSettler
	}
	return s.Settle(ctx, p)
}

func (k *keptClaim) Release(ctx context.Context) error {
	k.once.Do(k.stop)
	return k.Claim.Release(ctx)
}

// count updates the relay's counters after a batch.
func (r *Relay) count(p *outboxdriver.CompleteParams, failed int, unavailable bool) {
	switch {
	case unavailable:
		r.stats.brokerDownSince.CompareAndSwap(0, time.Now().UnixNano())
	case len(p.Published) > 0:
		r.stats.brokerDownSince.Store(0)
	}
	r.stats.batches.Add(1)
	r.stats.published.Add(int64(len(p.Published)))
	r.stats.failed.Add(int64(failed))
}

// writeBack marks (or deletes) what the broker acknowledged and records the failures,
// in the claim's transaction, in the background; marks is waited on before the next
// batch goes out. The returned channel is closed once it ended.
func (r *Relay) writeBack(work context.Context, marks *sync.WaitGroup, failed *atomic.Bool, c outboxdriver.Claim, p *outboxdriver.CompleteParams,
	rows int, claimWait, pubTime time.Duration) <-chan struct{} {
	marks.Add(1)
	ended := make(chan struct{})
	go func() {
		defer marks.Done()
		defer close(ended)
		start := time.Now()
		ctx, cancel := r.dbCtx(work)
		defer cancel()
		later := r.ledger != nil && r.store.Capabilities().CompletesLater
		if later {
			p.Completed = r.marked // once the rows' completion commits
		}
		if err := c.Complete(ctx, p); err != nil {
			// The rows stay unpublished and are sent again: a duplicate, never a loss
			// (a ledger answers them without sending).
			r.log.Error("relay: marking published rows failed; they will be published again", "rows", len(p.Published), "err", err)
			failed.Store(true)
			if r.ledger != nil && simbug.On("ledger-marked-early") {
				r.marked(p.Published)
			}
		} else {
			failpoint.Hit(failpoint.RelayAfterMark)
			if r.ledger != nil && !later {
				r.marked(p.Published)
			}
		}
		r.log.Debug("relay: batch", "rows", rows, "claim_wait", claimWait, "publish", pubTime, "mark", time.Since(start))
	}()
	return ended
}

// outcome turns the broker's results into what to write back: published ids, and for
// each failure whether it counts an attempt, when to retry, or whether the event is
// dead (refused permanently, or out of attempts).
func (r *Relay) outcome(rows []outboxdriver.Row, results []broker.Result) (p *outboxdriver.CompleteParams, failed int, unavailable bool) {
	p = &outboxdriver.CompleteParams{Completion: r.cfg.Completion, Published: make([]string, 0, len(rows))}
	r.late.published(rows, func(i int) bool { return results[i].Err == nil })
	now := time.Now()
	var failedKeys map[string]bool
	for i, res := range results {
		row := &rows[i]
		key := outboxdriver.AggregateKey(row.AggregateType, row.AggregateID)
		if res.Err == nil || simbug.On("unavailable-published") && broker.IsUnavailable(res.Err) {
			p.Published = append(p.Published, row.ID)
			if failedKeys[key] {
				// The broker took a later message of a key after refusing an earlier
				// one it had already been sent with; the publisher could not hold it.
				r.log.Warn("relay: a later event was published after an earlier event of its aggregate failed",
					"aggregatetype", safetext.Log(row.AggregateType), "aggregateid", safetext.Log(row.AggregateID), "id", row.ID)
			}
			continue
		}
		failed++
		if failedKeys == nil {
			failedKeys = map[string]bool{}
		}
		failedKeys[key] = true
		f := outboxdriver.Failure{ID: row.ID, Error: ErrorText(res.Err.Error(), maxErrorBytes)}
		switch {
		case simbug.On("dead-on-unavailable") && broker.IsUnavailable(res.Err):
			f.CountAttempt, f.Dead = true, true
		case broker.IsUnavailable(res.Err), errors.Is(res.Err, context.Canceled), errors.Is(res.Err, context.DeadlineExceeded):
			unavailable = true // not the event's fault
		case broker.IsHeldBack(res.Err):
			// waits behind its key's failing event; not its own failure
		case broker.IsDeferred(res.Err):
			// Its destination is not ready (no topic, no queue bound): it waits on its
			// own growing schedule, other topics go on, and it is never dead for it.
			// Attempts grow the wait but stop short of the limit.
			attempts := row.Attempts + 1
			f.CountAttempt = attempts < r.cfg.MaxAttempts
			f.RetryAt = now.Add(max(r.retryDelay(row.ID, min(attempts, r.cfg.MaxAttempts)), min(broker.RetryAfterOf(res.Err), r.cfg.RetryMax)))
		case broker.IsPermanent(res.Err):
			f.CountAttempt, f.Dead, f.HoldKey = true, true, !r.cfg.FlowPastDeadLetters
		default:
			f.CountAttempt = true
			attempts := row.Attempts + 1
			if attempts >= r.cfg.MaxAttempts {
				f.Dead, f.HoldKey = true, !r.cfg.FlowPastDeadLetters
				f.Error = fmt.Sprintf("gave up after %d attempts: %s", attempts, f.Error)
			} else {
				// The broker's own wait (Retry-After), when longer, wins; capped at RetryMax.
				f.RetryAt = now.Add(max(r.retryDelay(row.ID, attempts), min(broker.RetryAfterOf(res.Err), r.cfg.RetryMax)))
			}
		}
		if f.CountAttempt && outboxdriver.KeyTooLong(row.AggregateType, row.AggregateID) {
			// A key no index can hold: it can neither wait for a retry (its failing
			// row would index the key) nor hold back its aggregate (nor would a dead
			// letter holding it). Its first failure is final.
			f.Dead, f.HoldKey, f.RetryAt = true, false, time.Time{}
			f.Error = ErrorText(fmt.Sprintf("its aggregate key of %d bytes is longer than the %d an index can hold, so it cannot wait for a retry: %s",
				len(row.AggregateType)+len(row.AggregateID), outboxdriver.MaxKeyBytes, f.Error), maxErrorBytes)
		}
		if f.Dead {
			r.stats.dead.Add(1)
			r.log.Error("relay: moving the event to the dead letters", "id", row.ID, "aggregatetype", safetext.Log(row.AggregateType),
				"aggregateid", safetext.Log(row.AggregateID), "holds_key", f.HoldKey, "err", f.Error)
		}
		p.Failed = append(p.Failed, f)
	}
	return p, failed, unavailable
}

// retryDelay is the wait before attempt n+1 of an event refused n times: exponential
// from RetryMin, capped at RetryMax, with jitter (between half and all of it).
func (r *Relay) retryDelay(id string, n int) time.Duration {
	d := r.cfg.RetryMin
	for i := 1; i < n && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.RetryMax)
	return d/2 + r.jitter.n(d/2+1, id, uint64(n))
}

func firstErr(results []broker.Result) error {
	for _, r := range results {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// maxErrorBytes bounds the failure text stored with an event.
const maxErrorBytes = 1000

// ErrorText makes s safe to store and show: valid UTF-8 (bad bytes become U+FFFD), no
// NUL (PostgreSQL text refuses it), at most n bytes, cut on a character boundary. An
// error can quote a row's bytes; a write-back that the database refuses would leave
// every event of the batch unmarked.
func ErrorText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\\x00")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func payloadBytes(rows []outboxdriver.Row) int {
	n := 0
	for i := range rows {
		n += len(rows[i].Payload)
	}
	return n
}

// releasePending waits for a claim in progress and gives its rows back.
func (r *Relay) releasePending(ctx context.Context, next chan claimResult) {
	if next == nil {
		return
	}
	cr := <-next
	if cr.err == nil {
		rctx, cancel := r.dbCtx(ctx)
		defer cancel()
		_ = cr.claim.Release(rctx)
	}
}

// dbCtx bounds one database call by LeaderTimeout: a dead socket is an error within
// the leadership bound, never a hang.
func (r *Relay) dbCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.LeaderTimeout)
}

// bounded runs call under ctx with a deadline d from now.
func bounded(ctx context.Context, d time.Duration, call func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return call(ctx)
}

// waitFor waits d, or until a wake-up or ctx ends. It reports whether a wake-up came.
func (r *Relay) waitFor(ctx context.Context, wake <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		select {
		case <-wake:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// cleanup deletes published rows older than the retention, in small batches, while
// this relay leads. It never touches an unpublished row (the store's guard).
func (r *Relay) cleanup(ctx context.Context) {
	t := time.NewTicker(r.cfg.CleanupEvery)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			cctx, cancel := r.dbCtx(ctx)
			n, err := r.store.Cleanup(cctx, &outboxdriver.CleanupParams{Before: time.Now().Add(-r.cfg.Retention), Limit: r.cfg.CleanupBatch})
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					r.log.Warn("relay: cleanup failed", "err", err)
				}
				break
			}
			r.stats.cleaned.Add(n)
			if n < int64(r.cfg.CleanupBatch) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// listen forwards the writer's notifications to wake until ctx ends, reconnecting
// when the listening session dies. Notifications are only hints: polling stays the
// source of truth, so a lost one costs at most a poll interval.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	if !r.store.Capabilities().Listen {
		return // polling alone
	}
	bo := r.newBackoff("listen")
	for ctx.Err() == nil {
		lctx, cancel := r.dbCtx(ctx)
		l, err := r.store.Listen(lctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("relay: cannot listen for notifications; polling only", "err", err)
			}
			sleep(ctx, bo.next())
			continue
		}
		bo.reset()
		// What committed while no one listened (before the first LISTEN took
		// effect, or while the session was lost) notified no one: one look now.
		select {
		case wake <- struct{}{}:
		default:
		}
		for {
			// A listening session that stays silent for a whole LeaderTimeout is
			// listened again: a half-open connection would otherwise wait for ever
			// (the poll interval still covers what it misses).
			wctx, cancel := r.dbCtx(ctx)
			err := l.Wait(wctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
					r.log.Warn("relay: notification listener lost; reconnecting", "err", err)
				}
				break
			}
			select {
			case wake <- struct{}{}:
			default:
			}
		}
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = l.Close(closeCtx)
		cancel()
	}
}

// route builds the messages of a batch. A row the router cannot route fails
// permanently (it goes to the dead letters with the reason) and is not published;
// idx maps each message to its row.
func (r *Relay) route(rows []outboxdriver.Row) (msgs []broker.Message, idx []int, results []broker.Result) {
	msgs, idx = make([]broker.Message, 0, len(rows)), make([]int, 0, len(rows))
	results = make([]broker.Result, len(rows))
	for i := range rows {
		if r.cfg.Router == nil {
			msgs, idx = append(msgs, r.message(&rows[i])), append(idx, i)
			continue
		}
		m, err := r.cfg.Router.Route(&rows[i], r.esc)
		if err != nil {
			results[i].Err = broker.Permanent(err)
			continue
		}
		msgs, idx = append(msgs, m), append(idx, i)
	}
	return msgs, idx, results
}

// message builds the broker message for a row in outbox's own wire format.
func (r *Relay) message(row *outboxdriver.Row) broker.Message { return Message(row, r.tmpl, r.esc) }

// Message renders a row in outbox's own wire format (no Router): the topic from
// tmpl, with values escaped by escape (nil: none; broker.TopicEscaper's), the
// aggregate id as key, and the wire-format headers. It allocates a headers map only
// when the row carries a trace context: this runs for every event.
func Message(row *outboxdriver.Row, tmpl *broker.Template, escape func(string) string) broker.Message {
	h := row.Headers
	if tc := broker.TraceHeaders(row.TraceContext); tc != nil {
		h = make(map[string]string, len(row.Headers)+len(tc))
		for k, v := range row.Headers {
			h[k] = v
		}
		for k, v := range tc {
			h[k] = v
		}
	}
	id := row.ID
	if simbug.On("message-id") {
		id = fmt.Sprintf("%s-%d", row.ID, row.Attempts) // a new id per attempt: no dedup
	}
	return broker.Message{
		ID:            id,
		Topic:         tmpl.Execute(broker.TopicFields{AggregateType: row.AggregateType, Type: row.Type}, escape),
		Key:           row.AggregateID,
		EventType:     row.Type,
		AggregateType: row.AggregateType,
		AggregateID:   row.AggregateID,
		Payload:       row.Payload,
		PayloadNull:   row.PayloadNull,
		Seq:           row.Seq,
		Headers:       h,
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// backoff is exponential with full jitter between BackoffMin and BackoffMax.
type backoff struct {
	min, max, cur time.Duration
	jitter        jitter
	role          string // whose backoff: the jitter's stream
	draws         uint64
}

func (r *Relay) newBackoff(role string) *backoff {
	return &backoff{min: r.cfg.BackoffMin, max: r.cfg.BackoffMax, jitter: r.jitter, role: role}
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	b.draws++
	return b.cur/2 + b.jitter.n(b.cur/2+1, b.role, b.draws)
}

// jitter draws the relay's random waits. By default from the runtime's random
// source; with Config.Rand, each draw is a function of a seed taken from it, of whose
// wait it is (a backoff's role and how many it drew, an event's id and attempt), and
// of nothing else: the order in which goroutines draw cannot change what they get, so
// a simulation's seed replays its schedule.
type jitter struct {
	seed   uint64
	seeded bool
}

func newJitter(src rand.Source) jitter {
	if src == nil {
		return jitter{}
	}
	return jitter{seed: src.Uint64(), seeded: true}
}

// n returns a duration in [0, d): the k-th draw for key.
func (j jitter) n(d time.Duration, key string, k uint64) time.Duration {
	if !j.seeded {
		return rand.N(d)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return time.Duration(rand.New(rand.NewPCG(j.seed^h.Sum64(), k)).Int64N(int64(d)))
}

func (b *backoff) reset() { b.cur = 0 }
