package outboxdriver

import (
	"context"
	"slices"
)

// The head rule, the one rule of per-aggregate order in a claim: a claim takes a row
// only when every earlier unpublished event of its aggregate (due or failing: PrevSQL)
// is taken by the same claim or was sent ahead by the claiming relay and is not yet
// marked (ClaimParams.Ahead). Whoever holds an earlier row (another session's lock
// of any strength, another claim, an operator's open transaction), the row behind
// it waits: no lock decides order. The claim's query still skips locked rows, so one
// held aggregate holds back only itself.
//
// Rows the query matched but the rule left out stay held by the claim until it ends
// (a row lock cannot be given back alone); their aggregates are skipped by the rest of
// the claim, which reads on past them (up to claimRounds queries), so a held
// aggregate with many events behind it cannot fill the batch and starve the others.
//
// What no claim can see is a row not yet committed: an event whose transaction
// commits after a later event of its aggregate was claimed is published after it.
// The relay marks such an event late (docs/guarantees.md says what order means).

// claimRounds bounds the queries of one claim while the head rule holds rows back.
const claimRounds = 4

// ClaimQuery runs a driver's claim statement once, in the claim's transaction, for
// q (q.Limit rows at most, q.MaxBytes, q.Skip), taking only rows with seq > after,
// in seq order. It returns the rows it holds and, for each, PrevSQL's column (0 for
// NULL).
type ClaimQuery func(ctx context.Context, q *ClaimParams, after int64) (rows []Row, prev []int64, err error)

// ClaimHeads claims under the head rule: it runs query, keeps the rows the rule
// allows and, while it held some back and the batch is not full, queries again past
// them with their aggregates skipped.
func ClaimHeads(ctx context.Context, p *ClaimParams, query ClaimQuery) ([]Row, error) {
	ahead := slices.Clone(p.Ahead)
	slices.Sort(ahead)
	q := *p
	var (
		kept  []Row
		after int64
		bytes int
	)
	for round := 0; round < claimRounds; round++ {
		rows, prev, err := query(ctx, &q, after)
		if err != nil {
			return nil, err
		}
		var held []Aggregate
		for i := range rows {
			if !heads(prev[i], ahead, kept) {
				if a := (Aggregate{Type: rows[i].AggregateType, ID: rows[i].AggregateID}); !slices.Contains(held, a) {
					held = append(held, a)
				}
				continue
			}
			kept = append(kept, rows[i])
			bytes += len(rows[i].Payload)
		}
		if len(held) == 0 || len(rows) < q.Limit || len(kept) >= p.Limit || p.Enough(bytes) {
			return kept, nil
		}
		after = rows[len(rows)-1].Seq
		q.Limit = p.Limit - len(kept)
		if p.MaxBytes > 0 {
			q.MaxBytes = p.MaxBytes - bytes
		}
		q.Skip = append(slices.Clip(q.Skip), held...)
	}
	return kept, nil
}

// heads reports whether a row whose nearest earlier unpublished event is prev may
// be taken: it has none, or that one was sent ahead, or is taken by this claim (kept,
// in seq order).
func heads(prev int64, ahead []int64, kept []Row) bool {
	if prev == 0 {
		return true
	}
	if _, ok := slices.BinarySearch(ahead, prev); ok {
		return true
	}
	_, ok := slices.BinarySearchFunc(kept, prev, func(r Row, seq int64) int {
		switch {
		case r.Seq < seq:
			return -1
		case r.Seq > seq:
			return 1
		}
		return 0
	})
	return ok
}
