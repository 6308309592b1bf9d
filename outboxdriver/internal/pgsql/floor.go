package pgsql

import (
	"context"
	"sync"
	"time"
)

// floor lets a claim start its candidates read past the published prefix of the
// unpublished rows' index. A published row leaves its entry in that index until
// VACUUM, and a read from the oldest entry steps over all of them on every claim
// (docs/operations.md, "Vacuum and the polling claim"). The active value is a seq
// below which every row is published or gone and no row can come in later:
//
//   - A row comes in below a floor when its transaction took its seq before the floor
//     was read and commits after. Every such transaction holds the table's
//     RowExclusiveLock from before it took the seq (an INSERT locks the table before
//     it evaluates the identity) until it ends. So a probe reads the lowest
//     unpublished seq, then the transactions holding that lock; the candidate becomes
//     active only once every one of them has ended, and then no higher than the
//     lowest unpublished seq read after that (what they, and any writer that
//     committed between the probe's two reads, left unpublished).
//   - A dead letter goes back into the table with its own seq when it is replayed: the
//     floor is never above the lowest seq in the dead letters. (A row dead-lettered
//     later had an unpublished seq at or above the floor.)
//   - An identity that caches values (CACHE above 1) hands seqs out of order between
//     sessions: the store then keeps no floor.
//
// A relay with nothing unpublished takes the seq after the highest it claimed as the
// probe's candidate: that row committed before the claim that took it.
type floor struct {
	mu       sync.Mutex
	checked  bool  // the identity's cache was looked at
	off      bool  // it caches values: no floor
	active   int64 // the floor claims start from (0: none)
	claimed  int64 // the highest seq this store claimed
	probe    *floorProbe
	next     time.Time // no new probe before
	settleAt time.Time // the probe's writers are not looked at again before
}

// floorProbe is a candidate floor waiting for the writers seen with it to end.
type floorProbe struct {
	at      int64
	writers []string // virtual transaction ids holding the table's RowExclusiveLock
}

// floorEvery is how often a probe starts. Its reads (one statement, then two when it
// settles) delay the claims that make them, and a claim steps over at most what was
// published since the last floor: at 5,000 events/s, 50,000 entries, about 0.2 ms a
// claim (docs/benchmarks.md: probing every second measured no better).
const floorEvery = 10 * time.Second

// floorRetry is how soon a probe whose writers were still running looks again: a
// long transaction must not cost every claim a read of the locks.
const floorRetry = time.Second

// claimFloor returns the floor a claim may start from (0: the oldest entry), moving
// it on when a probe is due or done. Its reads failing leaves the floor as it was,
// which is always safe.
func (s *Store) claimFloor(ctx context.Context) int64 {
	f := &s.floor
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if f.off {
		return 0
	}
	if f.probe != nil {
		if now.Before(f.settleAt) {
			return f.active
		}
		at, ok := s.settleFloorProbe(ctx, f.probe)
		if !ok {
			f.settleAt = now.Add(floorRetry)
			return f.active
		}
		f.active, f.probe, f.next = at, nil, now.Add(floorEvery)
		return f.active
	}
	if now.Before(f.next) {
		return f.active
	}
	f.next = now.Add(floorEvery)
	if !f.checked {
		var cache int64
		if err := QueryRow(ctx, s.DB, `SELECT coalesce((SELECT seqcache FROM pg_sequence
  WHERE seqrelid = pg_get_serial_sequence($1, 'seq')::regclass), 0)`, []any{s.Statements.qualified}, &cache); err != nil {
			return f.active
		}
		f.checked, f.off = true, cache != 1
		if f.off {
			return 0
		}
	}
	p := s.startFloorProbe(ctx, f.claimed)
	switch {
	case p == nil || p.at == f.active:
	case p.at < f.active:
		// A row came in below the floor: a producer that set its seq itself, outside
		// what the floor accounts for. Start from the oldest entry until the probe
		// settles again.
		f.active, f.probe, f.settleAt = 0, p, now
	default:
		f.probe, f.settleAt = p, now
	}
	return f.active
}

// claimedUpTo records the highest seq a claim took.
func (s *Store) claimedUpTo(seq int64) {
	s.floor.mu.Lock()
	s.floor.claimed = max(s.floor.claimed, seq)
	s.floor.mu.Unlock()
}

// ClaimFloor is the floor claims start from now (0: the oldest entry), for tests.
func (s *Store) ClaimFloor() int64 {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	return s.floor.active
}

// ProbeFloorNow lets the next claim probe for a floor, or look at a probe's writers
// again, without waiting floorEvery or floorRetry, for tests.
func (s *Store) ProbeFloorNow() {
	s.floor.mu.Lock()
	s.floor.next, s.floor.settleAt = time.Time{}, time.Time{}
	s.floor.mu.Unlock()
}

// startFloorProbe reads a candidate floor and the writers that could still commit a
// row below it, in one statement: its snapshot is taken before it reads the locks.
// nil when there is none to read.
func (s *Store) startFloorProbe(ctx context.Context, claimed int64) *floorProbe {
	var low int64
	var writers []string
	if err := QueryRow(ctx, s.DB, `SELECT (`+s.Statements.lowestUnpublished()+`),
  (SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
   WHERE locktype = 'relation' AND relation = $1::regclass AND mode = 'RowExclusiveLock')`,
		[]any{s.Statements.qualified}, &low, &writers); err != nil {
		return nil
	}
	switch {
	case low > 0:
		return &floorProbe{at: low, writers: writers}
	case claimed > 0:
		return &floorProbe{at: claimed + 1, writers: writers}
	default:
		return nil // nothing written yet
	}
}

// settleFloorProbe makes p's candidate the floor once its writers have ended: no lower
// than what is unpublished then (their rows, and those of writers that committed
// between the probe's snapshot and its read of the locks) nor than the dead letters'
// lowest seq. The check comes first, in a statement of its own: the second's
// snapshot must be taken after the writers ended.
func (s *Store) settleFloorProbe(ctx context.Context, p *floorProbe) (int64, bool) {
	if len(p.writers) > 0 {
		var running bool
		if err := QueryRow(ctx, s.DB, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE virtualtransaction = ANY($1::text[]))`,
			[]any{p.writers}, &running); err != nil || running {
			return 0, false
		}
	}
	var low, dead int64
	if err := QueryRow(ctx, s.DB, `SELECT (`+s.Statements.lowestUnpublished()+`), (SELECT coalesce(min(seq), 0) FROM `+s.Statements.dead+`)`,
		nil, &low, &dead); err != nil {
		return 0, false
	}
	at := p.at
	for _, l := range []int64{low, dead} {
		if l > 0 {
			at = min(at, l)
		}
	}
	return at, true
}

// lowestUnpublished is the statement reading the lowest seq of an unpublished row
// (0: none).
func (st *Statements) lowestUnpublished() string {
	return `SELECT coalesce(min(seq), 0) FROM ` + st.qualified + ` WHERE published_at IS NULL`
}
