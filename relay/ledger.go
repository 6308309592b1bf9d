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
//     record no longer carries those ids;
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
// has a ledger per unit, and a source that cannot mark rows outside a claim (CDC).
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
		return fmt.Errorf("relay: a transactional publisher (exactly-once) needs a table store that marks rows outside a claim (a polling relay), not %T: %w", r.store, outboxdriver.ErrNotSupported)
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
}

// resumeUnits resumes the ledgers of the partitions (opened if new) at once, and the
// table's own when withTable, each bounded by limit; each marks what it holds. It
// returns the partitions that may be published (those resumed) and whether the table's
// was. A permanent error (a cluster without transactions) is returned; others leave
// the ledger to the next check.
//
// All at once, because every progress record shares a partition of the progress
// topic: a resume reads it read_committed, so it waits for any open transaction there,
// such as a paused member's. Resuming that member's partitions (the new owner's) aborts
// it, and that resume must not wait behind another.
func (r *Relay) resumeUnits(ctx context.Context, limit time.Duration, partitions []int, withTable bool) ([]int, bool, error) {
	type answer struct {
		p   int // -1: the table's
		err error
	}
	answers := make(chan answer, len(partitions)+1)
	for _, p := range partitions {
		go func() {
			answers <- answer{p, bounded(ctx, limit, func(ctx context.Context) error { return r.resumeUnit(ctx, p) })}
		}()
	}
	if withTable {
		go func() {
			answers <- answer{-1, bounded(ctx, limit, func(ctx context.Context) error { return r.resumeOne(ctx, r.ledger, "unit", "table") })}
		}()
	}
	var (
		ok      []int
		table   bool
		stop    error
		pending = len(partitions)
	)
	if withTable {
		pending++
	}
	for range pending {
		a := <-answers
		switch {
		case a.err == nil && a.p < 0:
			table = true
		case a.err == nil:
			ok = append(ok, a.p)
		case errStop(a.err):
			stop = a.err
		default:
			unit := "table"
			if a.p >= 0 {
				unit = fmt.Sprintf("p%d", a.p)
			}
			r.log.Warn("relay: could not resume a transactional publisher; tried again at the next check",
				"unit", unit, "err", a.err)
		}
	}
	slices.Sort(ok)
	return ok, table, stop
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
	defer u.mu.Unlock()
	for p, l := range u.by {
		if !slices.ContainsFunc(leased, func(l outboxdriver.Lease) bool { return l.Partition == p }) {
			_ = l.Close()
			delete(u.by, p)
		}
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
