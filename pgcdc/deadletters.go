package pgcdc

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxd/outbox/internal/safetext"
	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
)

// deadLetterStatement inserts dead letters from arrays, for a jsonb or bytea payload.
func deadLetterStatement(table, dead string, bytesPayload bool) string {
	arg, expr := "text", "p::jsonb"
	if bytesPayload {
		arg, expr = "bytea", "p"
	}
	// The row (rows mode) leaves the table in the same statement, so a replay can
	// insert it again and a backfill never sees it.
	return `WITH gone AS (DELETE FROM ` + table + ` WHERE id = ANY($1::uuid[]))
INSERT INTO ` + dead + ` (` + sqlrules.DeadLetterColumns + `)
SELECT id, at, aid, t, ` + expr + `, h::jsonb, tc, seq, coalesce(ca, now()), n, err, hold
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::` + arg + `[], $6::text[], $7::text[],
            $8::bigint[], $9::timestamptz[], $10::int[], $11::text[], $12::bool[]) AS u(id, at, aid, t, p, h, tc, seq, ca, n, err, hold)
ON CONFLICT (id) DO NOTHING`
}

// deadLetter moves events that must not be published now to the dead letters: rejected
// ones (dead, holding their aggregate unless flowPast), and those of an
// aggregate a dead letter holds (waiting there in order; replaying the aggregate
// brings them back). An aggregate whose dead letters were replayed or purged since
// is released and its events go back to the queue.
func (ss *session) deadLetter(ctx context.Context, es []*entry, flowPast bool) error {
	var dead []deadEntry
	var back []*entry
	stillHeld := map[string]bool{}
	var done []*entry
	for _, e := range es {
		key := aggregateKey(&e.row)
		if e.reject != nil {
			dead = append(dead, deadEntry{e, e.reject.Error(), !flowPast})
			done = append(done, e)
			continue
		}
		held, ok := stillHeld[key]
		if !ok {
			if err := ss.src.pool.QueryRow(ctx, ss.src.heldStmt, e.row.AggregateType, e.row.AggregateID).Scan(&held); err != nil {
				return fmt.Errorf("pgcdc: %w", err)
			}
			stillHeld[key] = held
		}
		if !held {
			back = append(back, e)
			continue
		}
		dead = append(dead, deadEntry{e, outboxdriver.WaitingBehindDeadLetter, false})
		done = append(done, e)
	}
	if err := ss.src.insertDead(ctx, dead); err != nil {
		return err
	}
	ss.heldMu.Lock()
	for key, held := range stillHeld {
		if !held {
			delete(ss.held, key)
		}
	}
	for _, d := range dead {
		if d.hold {
			ss.held[aggregateKey(&d.e.row)] = true
		}
	}
	ss.heldMu.Unlock()
	ss.q.giveBack(back)
	ss.q.done(done)
	return nil
}

type deadEntry struct {
	e    *entry
	err  string
	hold bool
}

// insertDead writes events into the dead letters from memory (in CDC mode the row
// may not exist: the insert-delete and table-less modes keep none).
func (s *Source) insertDead(ctx context.Context, ds []deadEntry) error {
	n := len(ds)
	if n == 0 {
		return nil
	}
	// A key too long for an index cannot hold its aggregate (the dead letters' index
	// of held keys would refuse it): the caller's entries say so too, as it records
	// the held keys from them.
	for i := range ds {
		if ds[i].hold && outboxdriver.KeyTooLong(ds[i].e.row.AggregateType, ds[i].e.row.AggregateID) {
			ds[i].hold = false
		}
	}
	// The statement deletes the events' rows: it must see them.
	xids := make([]uint32, n)
	for i, d := range ds {
		xids[i] = d.e.xid
	}
	if err := s.waitVisible(ctx, xids); err != nil {
		return err
	}
	ids, ats, aids, types, tcs, errs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]*string, n), make([]string, n)
	headers := make([]*string, n)
	seqs, attempts, holds := make([]int64, n), make([]int32, n), make([]bool, n)
	created := make([]*time.Time, n)
	var payloads any
	textPayloads, bytePayloads := make([]*string, n), make([][]byte, n)
	for i, d := range ds {
		r := &d.e.row
		ids[i], ats[i], aids[i], types[i], errs[i] = r.ID, r.AggregateType, r.AggregateID, r.Type, d.err
		seqs[i], attempts[i], holds[i] = r.Seq, int32(r.Attempts), d.hold
		if r.TraceContext != "" {
			tcs[i] = &r.TraceContext
		}
		if r.Headers != nil {
			b, _ := json.Marshal(r.Headers)
			h := string(b)
			headers[i] = &h
		}
		if !r.CreatedAt.IsZero() {
			created[i] = &r.CreatedAt
		}
		if !r.PayloadNull {
			p := string(r.Payload)
			textPayloads[i] = &p
			bytePayloads[i] = nonNil(r.Payload)
		}
	}
	payloads = textPayloads
	if s.bytesPayload {
		payloads = bytePayloads
	}
	_, err := s.pool.Exec(ctx, s.deadLetterStmt, ids, ats, aids, types, payloads, headers, tcs, seqs, created, attempts, errs, holds)
	if err != nil {
		return fmt.Errorf("pgcdc: dead letters: %w", interpret(err))
	}
	for _, d := range ds {
		s.log.Error("relay: event moved to the dead letters", "id", d.e.row.ID, "aggregatetype", safetext.Log(d.e.row.AggregateType),
			"aggregateid", safetext.Log(d.e.row.AggregateID), "holds_key", d.hold, "err", d.err)
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
