// Package natsinbox consumes outbox events from NATS JetStream through an inbox:
// each message is handled once in the consumer's transaction, acknowledged only after
// that transaction committed, and negatively acknowledged (redelivered) when the
// handler fails.
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
// the inbox's transaction, only on first delivery.
func Consume[TTx any](ctx context.Context, cons jetstream.Consumer, ib *inbox.Inbox[TTx], name string,
	fn func(ctx context.Context, tx TTx, m *inbox.Message) error) error {
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
			_ = msg.Nak() // comes again
			continue
		}
		_ = msg.Ack()
	}
}
