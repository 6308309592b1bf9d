// Package amqpinbox consumes outbox events from RabbitMQ through an inbox: each
// delivery is handled once in the consumer's transaction, acknowledged only after that
// transaction committed, and requeued after a growing pause when the handler fails
// (rejected without requeue, so to the queue's dead-letter exchange if it has one,
// when it fails permanently).
package amqpinbox

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outbox/inbox"
)

// Message reads the relay's wire format from a delivery (message_id is the event id).
func Message(d amqp.Delivery) inbox.Message {
	h := map[string]string{}
	for k, v := range d.Headers {
		h[k] = fmt.Sprint(v)
	}
	m := inbox.FromHeaders(h, d.Body)
	if m.ID == "" {
		m.ID = d.MessageId
	}
	return m
}

// Consume handles deliveries (from Channel.Consume with autoAck false) until ctx ends
// or the channel closes. opts may be nil.
func Consume[TTx any](ctx context.Context, deliveries <-chan amqp.Delivery, ib *inbox.Inbox[TTx], name string,
	fn func(ctx context.Context, tx TTx, m *inbox.Message) error, opts *inbox.ConsumeOptions) error {
	retry := inbox.NewRetrier(opts)
	failures := 0 // in a row: RabbitMQ does not count deliveries on classic queues
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return nil
			}
			m := Message(d)
			if _, err := ib.Handle(ctx, name, &m, func(ctx context.Context, tx TTx) error { return fn(ctx, tx, &m) }); err != nil {
				failures++
				wait, permanent := retry.Failed(name, &m, failures, err)
				if permanent {
					_ = d.Nack(false, false)
					continue
				}
				inbox.Sleep(ctx, wait) // no hot loop: RabbitMQ requeues at once
				_ = d.Nack(false, true)
				continue
			}
			failures = 0
			_ = d.Ack(false)
		}
	}
}
