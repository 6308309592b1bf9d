package outboxdriver

import (
	"context"
	"slices"

	"github.com/outboxd/outbox/internal/simbug"
)

// The head rule, the one rule of per-aggregate order in a claim: a claim takes a row
// only when every earlier unpublished event of its aggregate (due, or failing) is
// taken by the same claim or was sent ahead by the claiming relay and is not yet
// marked (ClaimParams.Ahead). Whoever holds an earlier row (another session's lock of
// any strength, another claim, an operator's open transaction), the row behind it
// waits: no lock decides order. One held aggregate holds back only itself.
//
// A claim is two reads per round. The candidates are read first, without locking:
// the unpublished rows the claim's conditions match, in seq order from the oldest,
// leaving out the rows sent ahead. Every earlier unpublished row of a candidate's
// aggregate that could hold it back is then among the candidates (or was sent ahead):
// a row not due holds nothing back, a failing row or a dead letter keeps its
// aggregate's later rows out of the candidates already. Then the candidates are
// locked, skipping those another session holds; a candidate that could not be
// locked holds back every later candidate of its aggregate. Rows locked but held back
// stay locked until the claim ends (a row lock cannot be given back alone); their
// aggregates are skipped by the rest of the claim, which reads on past them (up to
// claimRounds rounds), so a held aggregate with many events behind it cannot fill the
// batch and starve the others.
//
// Reading the candidates by seq from the oldest costs what the claim always cost; a
// lookup of each row's predecessor would walk, on PostgreSQL, every index entry its
// aggregate's published rows left until vacuum (measured: a drain 30-40% slower).
//
// What no claim can see is a row not yet committed: an event whose transaction
// commits after a later event of its aggregate was claimed is published after it.
// The relay marks such an event late (docs/guarantees.md says what order means).

// claimRounds bounds the rounds of one claim while the head rule holds rows back.
const claimRounds = 4

// Candidate is a row a claim may take, as its first read sees it.
type Candidate struct {
	Seq       int64
	Aggregate Aggregate
	Bytes     int // the payload's size, for ClaimParams.MaxBytes
}

// ClaimQueries are a driver's two reads of a claim, in the claim's transaction.
type ClaimQueries struct {
	// Candidates reads, without locking and whoever holds them, the unpublished rows
	// q's conditions match (due, not behind a failing row of their aggregate, not held
	// by a dead letter, q.Skip, q.MaxSeq, the group's partitions) with seq > after,
	// leaving out the seqs of ahead: at most q.Limit, in seq order.
	Candidates func(ctx context.Context, q *ClaimParams, after int64, ahead []int64) ([]Candidate, error)
	// Lock locks the rows of seqs (ascending) that are still unpublished and that no
	// other session holds (SKIP LOCKED), and returns them whole, in seq order, in a
	// slice that is ClaimHeads' from then on.
	Lock func(ctx context.Context, seqs []int64) ([]Row, error)
}

// ClaimHeads claims under the head rule with a driver's queries.
func ClaimHeads(ctx context.Context, p *ClaimParams, qs ClaimQueries) ([]Row, error) {
	q := *p
	var (
		kept  []Row
		after int64
		bytes int
	)
	for round := 0; round < claimRounds; round++ {
		cands, err := qs.Candidates(ctx, &q, after, p.Ahead)
		if err != nil {
			return nil, err
		}
		if len(cands) == 0 {
			return kept, nil
		}
		// The bytes bound, on the candidates: the claim locks no row it will not take.
		n, b := 0, bytes
		for n < len(cands) && (n == 0 && len(kept) == 0 || !p.Enough(b)) {
			b += cands[n].Bytes
			n++
		}
		if n == 0 {
			return kept, nil
		}
		cut := n < len(cands)
		want := make([]int64, n)
		for i := range want {
			want[i] = cands[i].Seq
		}
		rows, err := qs.Lock(ctx, want)
		if err != nil {
			return nil, err
		}
		if len(kept) == 0 {
			// The first round's rows are kept in place (a row is kept at an index no
			// later than its own): copying each, a few hundred bytes, into a growing
			// slice was a tenth of what a drain allocated.
			kept = rows[:0]
		}
		var held []Aggregate
		next := 0 // rows[next] is the first locked row not yet matched to a candidate
		for _, c := range cands[:n] {
			locked := next < len(rows) && rows[next].Seq == c.Seq
			heldBack := slices.Contains(held, c.Aggregate)
			switch {
			case locked && !heldBack:
				kept = append(kept, rows[next])
				bytes += len(rows[next].Payload)
			case !heldBack && !simbug.On("heads-off"):
				held = append(held, c.Aggregate)
			}
			if locked {
				next++
			}
		}
		if cut || len(cands) < q.Limit || len(held) == 0 || len(kept) >= p.Limit || p.Enough(bytes) {
			return kept, nil
		}
		after = cands[len(cands)-1].Seq
		q.Limit = p.Limit - len(kept)
		q.Skip = append(slices.Clip(q.Skip), held...)
	}
	return kept, nil
}

// ScanCandidates reads a Candidates query's rows: seq, aggregate type, aggregate id
// and payload size each, in that order.
func ScanCandidates(next func() bool, scan func(dest ...any) error, rowsErr func() error) ([]Candidate, error) {
	var out []Candidate
	for next() {
		var c Candidate
		if err := scan(&c.Seq, &c.Aggregate.Type, &c.Aggregate.ID, &c.Bytes); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rowsErr()
}
