package relay

import (
	"context"
	"errors"
	"fmt"

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

// checkLedger refuses what a ledger cannot run under: several active relays (one
// ledger per table), and a source that cannot mark rows outside a claim (CDC).
func (r *Relay) checkLedger() error {
	if r.ledger == nil {
		return nil
	}
	if r.cfg.Group != nil {
		return fmt.Errorf("relay: a transactional publisher (exactly-once) runs under a single active relay per table, not a group: %w", outboxdriver.ErrNotSupported)
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
	ids, err := r.ledger.Resume(ctx)
	if err != nil {
		return fmt.Errorf("resume the transactional publisher: %w", err)
	}
	if len(ids) > 0 {
		cctx, cancel := r.dbCtx(ctx)
		defer cancel()
		if err := r.store.(outboxdriver.Completer).CompletePublished(cctx, ids, r.cfg.Completion); err != nil {
			return fmt.Errorf("mark the %d events the broker holds from the last term: %w", len(ids), err)
		}
		r.ledger.Marked(ids)
	}
	r.log.Info("relay: resumed the transactional publisher", "already_published", len(ids))
	return nil
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
