package relay

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/failpoint"
	"github.com/outboxd/outbox/internal/simbug"
	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// A slow key holds only itself. A batch's answers are written back together, in the
// claim's transaction; but when they stop coming for StragglerAfter while some keys'
// answers are still out (a receiver that holds one aggregate's requests), the batch
// is split: what was answered is completed at once, and the keys still out become
// stragglers. Their rows are left unpublished and unlocked, every later claim skips
// their aggregates (ClaimParams.Skip: their order is theirs to keep), and once their
// answers come the pipeline settles them in a transaction of their own
// (outboxdriver.Settler) and lets their aggregates go on. The other aggregates flow
// meanwhile. A crash meanwhile loses nothing: a straggler's rows are unpublished, so
// the next leader sends them again.

// flight is one batch's publish under way. Results arrive as the broker decides them
// (broker.WithAnswers); once done is closed, every result is final.
type flight struct {
	rows    []outboxdriver.Row
	mu      sync.Mutex
	results []broker.Result
	decided []bool
	news    chan struct{} // a result came (capacity 1)
	done    chan struct{} // Publish returned
	took    time.Duration // set before done is closed
}

func (f *flight) decide(i int, res broker.Result) {
	f.mu.Lock()
	f.results[i], f.decided[i] = res, true
	f.mu.Unlock()
	select {
	case f.news <- struct{}{}:
	default:
	}
}

// startPublish routes a claimed batch and sends it to the broker, with tracing, in
// the background; the hooks hear of it once every answer came. A row the router
// refuses fails permanently, decided at once.
func (r *Relay) startPublish(work context.Context, rows []outboxdriver.Row) *flight {
	if n, first := dropReservedHeaders(rows); n > 0 {
		r.log.Warn("relay: row headers named as the wire format's own dropped (they could pass for the relay's); the events go on without them",
			"headers", n, "first", first)
	}
	if n := r.late.mark(rows); n > 0 {
		r.stats.late.Add(int64(n))
		r.log.Warn("relay: events committed after a later event of their aggregate was published; sent marked late",
			"events", n, "header", wire.HeaderLate+": "+wire.LateCommitted)
	}
	msgs, idx, results := r.route(rows)
	f := &flight{rows: rows, results: results, decided: make([]bool, len(rows)),
		news: make(chan struct{}, 1), done: make(chan struct{})}
	for i := range f.decided {
		f.decided[i] = true
	}
	for _, i := range idx {
		f.decided[i] = false
	}
	go func() {
		defer close(f.done)
		start := time.Now()
		var endTrace func([]broker.Result)
		if r.cfg.Tracer != nil {
			endTrace = r.cfg.Tracer.StartPublish(msgs)
		}
		ctx := work
		if r.splits() { // early answers serve only a batch that may be split
			ctx = broker.WithAnswers(work, msgs, func(j int, res broker.Result) { f.decide(idx[j], res) })
		}
		var pubResults []broker.Result
		if r.units != nil {
			partition := make([]int, len(msgs))
			for j, i := range idx {
				partition[j] = rows[i].Partition
			}
			pubResults = r.units.publish(ctx, msgs, partition)
		} else {
			pubResults = r.pub.Publish(ctx, msgs)
		}
		if endTrace != nil {
			endTrace(pubResults)
		}
		f.mu.Lock()
		for j, res := range pubResults {
			f.results[idx[j]], f.decided[idx[j]] = res, true
		}
		f.took = time.Since(start)
		f.mu.Unlock()
		failpoint.Hit(failpoint.RelayAfterPublish)
		r.hookBatch(rows, msgs, idx, f.results, f.took)
	}()
	return f
}

// hookBatch tells the hooks about a batch whose every answer came.
func (r *Relay) hookBatch(rows []outboxdriver.Row, msgs []broker.Message, idx []int, results []broker.Result, took time.Duration) {
	if r.cfg.Hooks == nil {
		return
	}
	outcomes := make([]Outcome, len(rows))
	for i := range rows {
		outcomes[i] = Outcome{Row: &rows[i], Err: results[i].Err}
	}
	for j, i := range idx {
		outcomes[i].Topic = msgs[j].Topic
	}
	r.hook("BatchPublished", func(h Hooks) { h.BatchPublished(outcomes, took) })
}

// straggler is the part of a split batch still out at the broker: the rows of the
// keys whose answers had not all come.
type straggler struct {
	claim outboxdriver.Claim
	f     *flight
	idx   []int                    // its rows in f
	keys  []outboxdriver.Aggregate // their aggregates, skipped by claims meanwhile
	marks <-chan struct{}          // the split batch's write-back ended
}

// flying is a pipeline's stragglers: whose aggregates claims skip, how many rows
// are out, and in which lease partitions. Only the pipeline's goroutine touches it.
type flying struct {
	keys   map[outboxdriver.Aggregate]bool
	rows   int
	parts  map[int]int     // a group's partitions: rows out in each
	n      int             // stragglers not yet landed
	landed chan *straggler // stragglers whose answers all came
}

func (fl *flying) skip() []outboxdriver.Aggregate {
	if len(fl.keys) == 0 {
		return nil
	}
	out := make([]outboxdriver.Aggregate, 0, len(fl.keys))
	for k := range fl.keys {
		out = append(out, k)
	}
	return out
}

// partitions returns the lease partitions with rows out as stragglers: a group member
// keeps them until those rows are settled (groupTerm.check).
func (fl *flying) partitions() []int {
	if len(fl.parts) == 0 {
		return nil
	}
	out := make([]int, 0, len(fl.parts))
	for part := range fl.parts {
		out = append(out, part)
	}
	return out
}

// held splits rows into those that may go out and how many wait behind a
// straggler of their aggregate (a claim made before the split may hold its later
// events; they stay unpublished, and unlocked once the claim completes).
func (fl *flying) held(rows []outboxdriver.Row) ([]outboxdriver.Row, int) {
	if len(fl.keys) == 0 {
		return rows, 0
	}
	out := make([]outboxdriver.Row, 0, len(rows))
	for i := range rows {
		if !fl.keys[outboxdriver.Aggregate{Type: rows[i].AggregateType, ID: rows[i].AggregateID}] {
			out = append(out, rows[i])
		}
	}
	return out, len(rows) - len(out)
}

// splits reports whether a batch may be split: the store can complete a claim in
// parts, StragglerAfter is on, and no ledger (a broker transaction commits whole). A
// group member keeps the partitions of its stragglers' rows until they are settled
// (groupTerm.check), so no other member claims them while they are out.
func (r *Relay) splits() bool {
	return r.cfg.StragglerAfter > 0 && r.ledger == nil && r.store.Capabilities().Split
}

// await waits for a batch's answers. It returns nil once all came; or, when they
// stop coming for StragglerAfter while some keys' are still out, the straggler those
// keys make (nil again if that would put more than a batch of rows in flight: the
// broker as a whole is slow, and the batch waits).
func (p *pipeline) await(f *flight, c outboxdriver.Claim) *straggler {
	if !p.r.splits() {
		<-f.done
		return nil
	}
	t := time.NewTimer(p.r.cfg.StragglerAfter)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return nil
		case <-f.news:
			t.Reset(p.r.cfg.StragglerAfter)
		case <-t.C:
			if s := p.cut(f, c); s != nil {
				return s
			}
			<-f.done
			return nil
		}
	}
}

// cut makes the straggler of f's keys still out, if the bound allows it.
func (p *pipeline) cut(f *flight, c outboxdriver.Claim) *straggler {
	f.mu.Lock()
	out := map[outboxdriver.Aggregate]bool{}
	for i, d := range f.decided {
		if !d {
			out[outboxdriver.Aggregate{Type: f.rows[i].AggregateType, ID: f.rows[i].AggregateID}] = true
		}
	}
	f.mu.Unlock()
	if len(out) == 0 {
		return nil
	}
	s := &straggler{claim: c, f: f}
	for i := range f.rows {
		if out[outboxdriver.Aggregate{Type: f.rows[i].AggregateType, ID: f.rows[i].AggregateID}] {
			s.idx = append(s.idx, i)
		}
	}
	if p.fly.rows+len(s.idx) > p.r.cfg.BatchSize {
		return nil
	}
	for k := range out {
		s.keys = append(s.keys, k)
		p.fly.keys[k] = !simbug.On("straggler-no-skip")
	}
	p.fly.rows += len(s.idx)
	p.fly.n++
	for _, i := range s.idx {
		p.fly.parts[f.rows[i].Partition]++
	}
	go func() {
		<-f.done
		p.fly.landed <- s // never blocks: at most BatchSize stragglers
		select {
		case p.wake <- struct{}{}: // an idle pipeline settles it now
		default:
		}
	}()
	return s
}

// answered returns the rows and results of f that are not the straggler's.
func (s *straggler) answered() ([]outboxdriver.Row, []broker.Result) {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	mine := make(map[int]bool, len(s.idx))
	for _, i := range s.idx {
		mine[i] = true
	}
	rows := make([]outboxdriver.Row, 0, len(f.rows)-len(s.idx))
	results := make([]broker.Result, 0, len(f.rows)-len(s.idx))
	for i := range f.rows {
		if !mine[i] {
			rows, results = append(rows, f.rows[i]), append(results, f.results[i])
		}
	}
	return rows, results
}

// land settles the stragglers whose answers all came, without waiting; with wait,
// it waits for every straggler (a term's end). The pipeline holds no transaction
// meanwhile (the last write-back landed, the prefetched claim is given back): a
// claim may hold locks on rows it read past, the straggler's among them (MySQL), and
// a settle skips locked rows, as it must for another relay's.
func (p *pipeline) land(wait bool) {
	for p.fly.n > 0 {
		var s *straggler
		if wait {
			s = <-p.fly.landed
		} else {
			select {
			case s = <-p.fly.landed:
			default:
				return
			}
		}
		p.marks.Wait()
		p.dropPrefetched()
		p.settle(s)
	}
}

// settle writes a straggler's outcome in a transaction of its own, once its batch's
// write-back ended, and gives its aggregates back to the claims (the prefetched claim,
// which may hold their later events claimed before a failure was recorded, was
// given back: land).
func (p *pipeline) settle(s *straggler) {
	r := p.r
	<-s.marks
	rows, results := pick(s.f, s.idx)
	if simbug.On("settle-all-published") {
		results = make([]broker.Result, len(results))
	}
	params, failed, unavailable := r.outcome(rows, results)
	r.count(params, failed, unavailable)
	settler, _ := s.claim.(outboxdriver.Settler)
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := r.dbCtx(p.work)
		err = settler.Settle(ctx, params)
		cancel()
		if err == nil || p.work.Err() != nil {
			break
		}
		sleep(p.work, p.bo.next())
	}
	if err != nil {
		r.log.Error("relay: writing back a slow key's answers failed; its rows will be published again", "rows", len(rows), "err", err)
	}
	for _, k := range s.keys {
		delete(p.fly.keys, k)
	}
	for i := range rows {
		part := rows[i].Partition
		if p.fly.parts[part]--; p.fly.parts[part] == 0 {
			delete(p.fly.parts, part)
		}
	}
	p.fly.rows -= len(s.idx)
	p.fly.n--
	r.log.Debug("relay: slow key settled", "rows", len(rows), "keys", len(s.keys), "failed", failed)
}

// pick returns f's rows and results at idx.
func pick(f *flight, idx []int) ([]outboxdriver.Row, []broker.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rows, results := make([]outboxdriver.Row, len(idx)), make([]broker.Result, len(idx))
	for j, i := range idx {
		rows[j], results[j] = f.rows[i], f.results[i]
	}
	return rows, results
}

// errNoSettler is keptClaim's Settle on a claim that cannot settle.
var errNoSettler = errors.New("relay: the claim cannot be completed in parts")
