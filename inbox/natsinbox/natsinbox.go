// Package natsinbox consumes outbox events from NATS JetStream through an inbox:
// each message is handled once in the consumer's transaction, acknowledged only after
// that transaction committed, and negatively acknowledged with a growing delay when
// the handler fails (terminated, never redelivered, when it fails permanently).
package natsinbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/inbox"
)

// Message reads the relay's wire format from a JetStream message.
func Message(msg jetstream.Msg) inbox.Message {
	h := map[string]string{}
	for k := range msg.Headers() {
		h[k] = msg.Headers().Get(k)
	}
	m := inbox.FromHeaders(h, msg.Data())
	if m.ID == "" {
		m.ID = msg.Headers().Get(jetstream.MsgIDHeader)
	}
	return m
}

// Consume handles messages from cons until ctx ends (then it returns nil). fn runs in
// the inbox's transaction, only on first delivery. opts may be nil.
func Consume[TTx any](ctx context.Context, cons jetstream.Consumer, ib *inbox.Inbox[TTx], name string,
	fn func(ctx context.Context, tx TTx, m *inbox.Message) error, opts *inbox.ConsumeOptions) error {
	retry := inbox.NewRetrier(opts)
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("natsinbox: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("natsinbox: %w", err)
		}
		m := Message(msg)
		if _, err := ib.Handle(ctx, name, &m, func(ctx context.Context, tx TTx) error { return fn(ctx, tx, &m) }); err != nil {
			attempt := 1
			if md, mdErr := msg.Metadata(); mdErr == nil {
				attempt = int(md.NumDelivered)
			}
			if wait, permanent := retry.Failed(name, &m, attempt, err); permanent {
				_ = msg.Term()
			} else {
				_ = msg.NakWithDelay(wait)
			}
			continue
		}
		_ = msg.Ack()
	}
}
