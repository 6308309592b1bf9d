package pgcdc

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A transaction reaches the stream as soon as its commit record is flushed, but other
// sessions see it only a moment later, once it leaves PostgreSQL's list of running
// transactions (much later under synchronous replication, which waits in between). A
// statement the source runs about a streamed event (moving its row to the dead
// letters) must first wait for the event's transaction to be visible: run in that
// window, it would not find the row, and leave it behind in the table.

// snapshot is what pg_current_snapshot() prints: xmin:xmax:xip,... (64-bit ids).
type snapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

func parseSnapshot(s string) (snapshot, error) {
	var snap snapshot
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snap, fmt.Errorf("pgcdc: snapshot %q: want xmin:xmax:xip", s)
	}
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snap, fmt.Errorf("pgcdc: snapshot %q: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snap, fmt.Errorf("pgcdc: snapshot %q: %w", s, err)
	}
	if snap.xmin > snap.xmax || snap.xmax > 1<<62 {
		return snap, fmt.Errorf("pgcdc: snapshot %q: xmin and xmax out of order or range", s)
	}
	if parts[2] == "" {
		return snap, nil
	}
	for _, f := range strings.Split(parts[2], ",") {
		x, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return snap, fmt.Errorf("pgcdc: snapshot %q: %w", s, err)
		}
		snap.xip = append(snap.xip, x)
	}
	return snap, nil
}

// visible reports whether the transaction xid (32 bits, as the stream gives it) has
// ended as far as this snapshot is concerned. A streamed transaction is recent, so
// it lies within 2^31 of xmax and its epoch follows from xmax's.
func (s snapshot) visible(xid uint32) bool {
	d := int32(xid - uint32(s.xmax))
	if d >= 0 {
		return false // at or past xmax: not ended when the snapshot was taken
	}
	full := uint64(int64(s.xmax) + int64(d))
	return full < s.xmin || !slices.Contains(s.xip, full)
}

// waitVisible returns once every given transaction is visible to new snapshots (0:
// no transaction, nothing to wait for), or ctx ends.
func (s *Source) waitVisible(ctx context.Context, xids []uint32) error {
	xids = slices.DeleteFunc(slices.Clone(xids), func(x uint32) bool { return x == 0 })
	if snap, ok := s.recentSnapshot(); ok {
		// The claim that read these rows waited for them already: the marker that
		// marks them, or the dead letters that take them, need not ask again.
		xids = slices.DeleteFunc(xids, snap.visible)
	}
	if len(xids) == 0 {
		return nil
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		var text string
		if err := s.pool.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&text); err != nil {
			return fmt.Errorf("pgcdc: %w", interpret(err))
		}
		snap, err := parseSnapshot(text)
		if err != nil {
			return err
		}
		s.remember(snap)
		xids = slices.DeleteFunc(xids, snap.visible)
		if len(xids) == 0 {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgcdc: waiting for transaction %d to become visible: %w", xids[0], ctx.Err())
		}
	}
}

// seenFor is how long a snapshot waitVisible read is trusted for the transactions that
// had ended in it. Far less than the 2^31 transactions a 32-bit id is judged within
// (visible) could take; kept short so that a snapshot is always a recent one.
const seenFor = time.Second

// recentSnapshot is the latest snapshot read, if it was read within seenFor.
func (s *Source) recentSnapshot() (snapshot, bool) {
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	return s.seen, !s.seenAt.IsZero() && time.Since(s.seenAt) < seenFor
}

// remember keeps snap as the latest snapshot read, unless a later one is kept.
func (s *Source) remember(snap snapshot) {
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	if snap.xmax >= s.seen.xmax {
		s.seen, s.seenAt = snap, time.Now()
	}
}
