// Package pubsubinbox consumes outbox events from a Google Cloud Pub/Sub subscription
// through an inbox: each message is handled once in the consumer's transaction and
// acknowledged only after that transaction committed. A failing message is nacked
// after a growing pause (Pub/Sub redelivers it; with message ordering on the
// subscription, the key's later messages wait for it); a permanent failure is logged
// and acknowledged (skipped).
package pubsubinbox

import (
	"context"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/outboxd/outbox/inbox"
)

// Message reads the relay's wire format from a Pub/Sub message: the attributes are
// the headers, the ordering key the aggregate id when no header says it.
func Message(m *gpubsub.Message) inbox.Message {
	msg := inbox.FromHeaders(m.Attributes, m.Data)
	if msg.AggregateID == "" {
		msg.AggregateID = m.OrderingKey
	}
	return msg
}

// Consume receives from sub until ctx ends (then it returns nil). fn runs in the
// inbox's transaction, only on first delivery. opts may be nil.
func Consume[TTx any](ctx context.Context, sub *gpubsub.Subscriber, ib *inbox.Inbox[TTx], name string,
	fn func(ctx context.Context, tx TTx, m *inbox.Message) error, opts *inbox.ConsumeOptions) error {
	retry := inbox.NewRetrier(opts)
	err := sub.Receive(ctx, func(ctx context.Context, pm *gpubsub.Message) {
		m := Message(pm)
		if _, err := ib.Handle(ctx, name, &m, func(ctx context.Context, tx TTx) error { return fn(ctx, tx, &m) }); err != nil {
			attempt := 1
			if pm.DeliveryAttempt != nil {
				attempt = *pm.DeliveryAttempt
			}
			wait, permanent := retry.Failed(name, &m, attempt, err)
			if !permanent {
				inbox.Sleep(ctx, wait)
				pm.Nack()
				return
			}
		}
		pm.Ack()
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}
