package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/outboxdriver"
)

// A broker.Ledger publisher (Kafka's transactions) records in the broker, atomically
// with each batch, the ids it published. The relay's part:
//   - at the start of every term, before it publishes, it resumes the ledger (which
//     fences the owner before it) and marks the rows of the ids the ledger returns,
//     outside any claim (outboxdriver.Completer): they are in the broker already;
//   - once a batch's mark committed, it tells the ledger (Marked), so the next batch's
//     record no longer carries those ids. A store that completes rows after Complete
//     returns (CDC: Capabilities.CompletesLater) tells it through
//     CompleteParams.Completed;
//   - a batch that comes back fenced (broker.ErrFenced: a newer owner, or a commit
//     whose outcome only a resume can tell) ends the term; the relay takes the table
//     again, and resumes, or stands by.
//
// Splitting a batch around a slow key is off: a transaction commits whole.
//
// A group member (several active relays) needs a broker.UnitLedger: one ledger per
// lease partition (units), so that a partition's new owner fences the old owner's
// producer. A partition is resumed when it becomes ready (groupTerm.check), after the
// barrier; a batch goes out as one transaction per partition; a partition given up
// closes its ledger. Each group term also resumes the table's own ledger, with its
// first partitions: that fences a single active relay that ran before the group and
// marks what it left.

// checkLedger refuses what a ledger cannot run under: a group, unless the publisher
// has a ledger per unit, and a source that cannot mark rows outside a claim.
func (r *Relay) checkLedger() error {
	if r.ledger == nil {
		return nil
	}
	if r.cfg.Group != nil {
		if _, ok := r.ledger.(broker.UnitLedger); !ok {
			return fmt.Errorf("relay: a transactional publisher (exactly-once) in a group needs one ledger per partition (a broker.UnitLedger), not %T: %w", r.ledger, outboxdriver.ErrNotSupported)
		}
	}
	if _, ok := r.store.(outboxdriver.Completer); !ok {
		return fmt.Errorf("relay: a transactional publisher (exactly-once) needs a table store that marks rows outside a claim, not %T: %w", r.store, outboxdriver.ErrNotSupported)
	}
	return nil
}

// resumeLedger resumes the ledger for a new term and marks what the broker holds.
func (r *Relay) resumeLedger(ctx context.Context) error {
	if r.ledger == nil {
		return nil
	}
	return r.resumeOne(ctx, r.ledger)
}

// resumeOne resumes one ledger and marks what it holds; logArgs say which.
func (r *Relay) resumeOne(ctx context.Context, l broker.Ledger, logArgs ...any) error {
	ids, err := l.Resume(ctx)
	if err != nil {
		return fmt.Errorf("resume the transactional publisher: %w", err)
	}
	if len(ids) > 0 {
		cctx, cancel := r.dbCtx(ctx)
		defer cancel()
		if err := r.store.(outboxdriver.Completer).CompletePublished(cctx, ids, r.cfg.Completion); err != nil {
			return fmt.Errorf("mark the %d events the broker holds from the last term: %w", len(ids), err)
		}
		l.Marked(ids)
	}
	r.log.Info("relay: resumed the transactional publisher", append(logArgs, "already_published", len(ids))...)
	return nil
}

// units are a group member's ledgers, one per lease partition it owns.
type units struct {
	open func(name string) (broker.Ledger, error)
	mu   sync.Mutex
	by   map[int]broker.Ledger
	// Resumes run in the background, across checks: under load a resume may outlast
	// a check, and one restarted at every check would never end. tableUnit (-1) is
	// the table's own ledger. gen counts terms: a resume of an earlier term that ends
	// late counts for nothing.
	resuming map[int]bool
	resumed  map[int]bool
	stop     error // a permanent error a resume met
	gen      int
	news     chan struct{} // a resume ended
}

// tableUnit stands for the table's own ledger among the units.
const tableUnit = -1

func newUnits(open func(name string) (broker.Ledger, error)) *units {
	return &units{open: open, by: map[int]broker.Ledger{}, resuming: map[int]bool{}, resumed: map[int]bool{}, news: make(chan struct{}, 1)}
}

// newTerm forgets what was resumed: a term resumes every ledger again.
func (u *units) newTerm() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.gen++
	clear(u.resumed)
	clear(u.resuming)
	u.stop = nil
}

// resumeUnits starts, in the background, the resume of each partition's ledger (opened
// if new) and of the table's own when withTable, unless one is under way. It waits for
// them up to wait, then returns the partitions resumed (each marked what it holds),
// whether the table's is, and a permanent error a resume met (a cluster without
// transactions). The others go on resuming; a resume that fails otherwise is logged and
// started again at the next check.
//
// All at once, because every progress record shares a partition of the progress
// topic: a resume reads it read_committed, so it waits for any open transaction there,
// such as a paused member's. Resuming that member's partitions (the new owner's) aborts
// it, and that resume must not wait behind another.
func (r *Relay) resumeUnits(ctx context.Context, wait time.Duration, partitions []int, withTable bool) ([]int, bool, error) {
	u := r.units
	want := partitions
	if withTable {
		want = append(slices.Clone(partitions), tableUnit)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for first := true; ; first = false {
		u.mu.Lock()
		if u.stop != nil {
			u.mu.Unlock()
			return nil, false, u.stop
		}
		var ok []int
		pending := 0
		for _, p := range want {
			switch {
			case u.resumed[p]:
				if p != tableUnit {
					ok = append(ok, p)
				}
			case u.resuming[p]:
				pending++
			case first: // a resume that failed meanwhile waits for the next check
				u.resuming[p] = true
				pending++
				go r.resumeInBackground(ctx, p, u.gen) // ends with the term's work
			}
		}
		table := u.resumed[tableUnit]
		u.mu.Unlock()
		if pending == 0 {
			return ok, table, nil
		}
		select {
		case <-u.news:
		case <-timer.C:
			return ok, table, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

func (r *Relay) resumeInBackground(ctx context.Context, p, gen int) {
	u := r.units
	err := bounded(ctx, r.cfg.LeaderTimeout, func(ctx context.Context) error {
		if p == tableUnit {
			return r.resumeOne(ctx, r.ledger, "unit", "table")
		}
		return r.resumeUnit(ctx, p)
	})
	u.mu.Lock()
	defer u.mu.Unlock()
	if gen != u.gen {
		return
	}
	delete(u.resuming, p)
	select {
	case u.news <- struct{}{}:
	default:
	}
	switch {
	case err == nil:
		// Unless the partition was given up meanwhile (keep closed its ledger).
		u.resumed[p] = p == tableUnit || u.by[p] != nil
	case errStop(err):
		u.stop = err
	default:
		unit := "table"
		if p != tableUnit {
			unit = fmt.Sprintf("p%d", p)
		}
		r.log.Warn("relay: could not resume a transactional publisher; tried again at the next check", "unit", unit, "err", err)
	}
}

func (r *Relay) resumeUnit(ctx context.Context, p int) error {
	u := r.units
	u.mu.Lock()
	l, ok := u.by[p]
	if !ok {
		var err error
		if l, err = u.open(fmt.Sprintf("p%d", p)); err != nil {
			u.mu.Unlock()
			return err
		}
		u.by[p] = l
	}
	u.mu.Unlock()
	return r.resumeOne(ctx, l, "partition", p)
}

// keep closes the ledgers of the partitions not leased: given up, or taken over.
func (u *units) keep(leased []outboxdriver.Lease) {
	u.mu.Lock()
	var gone []broker.Ledger
	for p, l := range u.by {
		if !slices.ContainsFunc(leased, func(l outboxdriver.Lease) bool { return l.Partition == p }) {
			gone = append(gone, l)
			delete(u.by, p)
			delete(u.resumed, p)
		}
	}
	u.mu.Unlock()
	for _, l := range gone { // outside the lock: a resume under way holds the ledger a while
		_ = l.Close()
	}
}

func (u *units) closeAll() {
	u.keep(nil)
}

// publish sends each partition's messages in a transaction of that partition's ledger,
// all at once; partition[j] is msgs[j]'s.
func (u *units) publish(ctx context.Context, msgs []broker.Message, partition []int) []broker.Result {
	byPart := map[int][]int{}
	for j := range msgs {
		byPart[partition[j]] = append(byPart[partition[j]], j)
	}
	results := make([]broker.Result, len(msgs))
	var wg sync.WaitGroup
	for p, idx := range byPart {
		u.mu.Lock()
		l := u.by[p]
		u.mu.Unlock()
		if l == nil {
			err := broker.Unavailable(fmt.Errorf("%w: partition %d has no resumed transactional publisher", broker.ErrFenced, p))
			for _, j := range idx {
				results[j].Err = err
			}
			continue
		}
		part := make([]broker.Message, len(idx))
		for k, j := range idx {
			part[k] = msgs[j]
		}
		wg.Go(func() {
			for k, res := range l.Publish(ctx, part) {
				results[idx[k]] = res
			}
		})
	}
	wg.Wait()
	return results
}

// marked tells every ledger the ids are marked (a ledger that never had them ignores
// them).
func (r *Relay) marked(ids []string) {
	if r.units == nil {
		r.ledger.Marked(ids)
		return
	}
	r.units.mu.Lock()
	defer r.units.mu.Unlock()
	for _, l := range r.units.by {
		l.Marked(ids)
	}
}

// fencedErr returns the first result that says the publisher was fenced, or nil.
func fencedErr(results []broker.Result) error {
	for _, res := range results {
		if broker.IsFenced(res.Err) {
			return res.Err
		}
	}
	return nil
}

// errStop reports whether a term's error must stop the relay rather than end the
// term: a publisher that can never publish (a broker without transactions).
func errStop(err error) bool {
	return errors.Is(err, outboxdriver.ErrNeedsOperator) || broker.IsPermanent(err)
}
