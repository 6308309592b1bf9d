// Package kafkainbox consumes outbox events from Kafka through an inbox: each record
// is handled once in the consumer's transaction, and its offset committed only after
// that transaction committed. Kafka has no per-record redelivery: a failing handler is
// retried in place (with backoff), so the partition's order holds.
//
// When the relay publishes in Kafka transactions (exactly-once, kafka.TxPublisher),
// build the client with kgo.FetchIsolationLevel(kgo.ReadCommitted()): franz-go, like
// every Kafka client, reads uncommitted by default, which also hands over the records
// of transactions Kafka aborted (a relay killed or fenced in the middle of one). Read
// committed, each event arrives once, and the inbox is the second line of defence.
package kafkainbox

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outbox/inbox"
)

// Message reads the relay's wire format from a record.
func Message(r *kgo.Record) inbox.Message {
	h := make(map[string]string, len(r.Headers))
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	m := inbox.FromHeaders(h, r.Value)
	if m.AggregateID == "" {
		m.AggregateID = string(r.Key)
	}
	return m
}

// Consume polls cl (a group consumer built with kgo.DisableAutoCommit, and
// kgo.FetchIsolationLevel(kgo.ReadCommitted()) behind a transactional relay) until ctx
// ends.
// A failing record is retried in place (its partition waits, keeping the order) with
// a growing pause; a permanent failure is logged and skipped. opts may be nil.
func Consume[TTx any](ctx context.Context, cl *kgo.Client, ib *inbox.Inbox[TTx], name string,
	fn func(ctx context.Context, tx TTx, m *inbox.Message) error, opts *inbox.ConsumeOptions) error {
	retry := inbox.NewRetrier(opts)
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return fmt.Errorf("kafkainbox: fetch %s/%d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		var done []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			if ctx.Err() != nil {
				return
			}
			m := Message(r)
			for attempt := 1; ctx.Err() == nil; attempt++ {
				_, err := ib.Handle(ctx, name, &m, func(ctx context.Context, tx TTx) error { return fn(ctx, tx, &m) })
				if err == nil {
					done = append(done, r)
					return
				}
				wait, permanent := retry.Failed(name, &m, attempt, err)
				if permanent {
					done = append(done, r) // skipped: it can never succeed
					return
				}
				inbox.Sleep(ctx, wait)
			}
		})
		if len(done) > 0 {
			if err := cl.CommitRecords(context.WithoutCancel(ctx), done...); err != nil {
				return fmt.Errorf("kafkainbox: commit: %w", err)
			}
		}
	}
	return nil
}
