package relay

import (
	"hash/maphash"
	"sync"

	"github.com/outboxd/outbox/internal/simbug"
	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// lateMarks remembers, per aggregate, the highest seq this relay has published, so an
// event published after a later event of its aggregate goes out marked late
// (outbox-late: committed-late) instead of reaching a consumer's version guard as
// an old version. The head rule (outboxdriver.ClaimHeads) keeps every claimable row
// in order; what it cannot see is a row whose transaction commits after a later row
// of its aggregate was published (two writers that do not serialize the aggregate),
// and in CDC mode the stream's commit order. Those rows are the ones marked here.
//
// It is bounded: two generations of at most lateMarksSize aggregates each, the
// older dropped whole when the newer fills. An aggregate quiet for that long is
// forgotten, and so is everything across a restart or a takeover by another relay:
// a row committing that late, after such a gap, goes out unmarked
// (docs/guarantees.md says so).
type lateMarks struct {
	mu        sync.Mutex
	seed      maphash.Seed
	cur, prev map[uint64]int64
}

const lateMarksSize = 1 << 16

func newLateMarks() *lateMarks {
	return &lateMarks{seed: maphash.MakeSeed(), cur: map[uint64]int64{}}
}

func (l *lateMarks) key(r *outboxdriver.Row) uint64 {
	var h maphash.Hash
	h.SetSeed(l.seed)
	h.WriteString(r.AggregateType)
	h.WriteByte(0)
	h.WriteString(r.AggregateID)
	return h.Sum64()
}

func (l *lateMarks) highest(k uint64) int64 {
	if s, ok := l.cur[k]; ok {
		return s
	}
	return l.prev[k]
}

// mark sets the late header on each row of a batch about to be sent that follows a
// later event of its aggregate: one already published, or one before it in the batch.
// It returns how many it marked.
func (l *lateMarks) mark(rows []outboxdriver.Row) (n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var inBatch map[uint64]int64 // only for a batch out of seq order (CDC's commit order)
	for i := 1; i < len(rows); i++ {
		if rows[i].Seq < rows[i-1].Seq {
			inBatch = map[uint64]int64{}
			break
		}
	}
	for i := range rows {
		r := &rows[i]
		if r.Seq <= 0 {
			continue
		}
		k := l.key(r)
		top := l.highest(k)
		if inBatch != nil {
			top = max(top, inBatch[k])
			inBatch[k] = max(inBatch[k], r.Seq)
		}
		if r.Seq >= top || r.Headers[wire.HeaderLate] != "" || simbug.On("late-unmarked") {
			continue
		}
		h := make(map[string]string, len(r.Headers)+1)
		for k, v := range r.Headers {
			h[k] = v
		}
		h[wire.HeaderLate] = wire.LateCommitted
		r.Headers = h
		n++
	}
	return n
}

// published records the rows the broker acknowledged.
func (l *lateMarks) published(rows []outboxdriver.Row, ok func(i int) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range rows {
		if !ok(i) || rows[i].Seq <= 0 {
			continue
		}
		k := l.key(&rows[i])
		if rows[i].Seq <= l.highest(k) {
			continue
		}
		if _, in := l.cur[k]; !in && len(l.cur) >= lateMarksSize {
			l.prev, l.cur = l.cur, make(map[uint64]int64, lateMarksSize)
		}
		l.cur[k] = rows[i].Seq
	}
}
