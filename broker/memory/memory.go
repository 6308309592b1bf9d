// Package memory is an in-process broker for tests and demos. It passes the same
// conformance suite (brokertest) as the real publishers: it keeps order, drops
// duplicate ids like a broker with dedup, refuses oversized messages permanently, and
// can be switched off to play an outage.
package memory

import (
	"context"
	"fmt"
	"sync"

	"github.com/outboxd/outbox/broker"
)

// MaxMessageBytesDefault is the largest payload the memory broker takes by default.
const MaxMessageBytesDefault = 1 << 20

// Broker is an in-memory broker and its publisher.
type Broker struct {
	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change
	msgs     []broker.Message
	seen     map[string]bool
	dups     int
	down     bool
	maxBytes int
	refuse   map[string]bool // key -> permanent
}

// New returns an empty broker. maxMessageBytes <= 0 means MaxMessageBytesDefault.
func New(maxMessageBytes int) *Broker {
	if maxMessageBytes <= 0 {
		maxMessageBytes = MaxMessageBytesDefault
	}
	return &Broker{changed: make(chan struct{}), seen: map[string]bool{}, maxBytes: maxMessageBytes, refuse: map[string]bool{}}
}

var _ broker.Publisher = (*Broker)(nil)

// Publish implements broker.Publisher.
func (b *Broker) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	res := broker.Sequence(ctx, msgs, broker.Schedule{}, broker.Sender{
		Prepare: func(_ context.Context, i int) error {
			m := &msgs[i]
			permanent, refused := b.refuse[m.Key]
			switch {
			case b.down:
				return broker.Unavailable(fmt.Errorf("memory broker is down"))
			case len(m.Payload) > b.maxBytes:
				return broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the limit of %d", len(m.Payload), b.maxBytes))
			case refused && permanent:
				return broker.Permanent(fmt.Errorf("memory broker refuses key %q", m.Key))
			case refused:
				return fmt.Errorf("memory broker refuses key %q", m.Key)
			}
			return nil
		},
		Send: func(_ context.Context, i int) (broker.Future, error) {
			m := msgs[i]
			if b.seen[m.ID] {
				b.dups++ // acknowledged, not stored: what a broker with dedup does
				return broker.Answered{}, nil
			}
			b.seen[m.ID] = true
			h := make(map[string]string, m.HeaderCount())
			m.EachHeader(func(k, v string) { h[k] = v })
			m.Headers = h
			m.Payload = append([]byte(nil), m.Payload...)
			b.msgs = append(b.msgs, m)
			return broker.Answered{}, nil
		},
	})
	close(b.changed)
	b.changed = make(chan struct{})
	return res
}

// Features implements broker.Publisher.
func (b *Broker) Features() broker.Features {
	return broker.Features{BrokerDedup: true, PerKeyOrdering: true, Headers: true, MaxMessageBytes: b.maxBytes}
}

// Close implements broker.Publisher.
func (b *Broker) Close() error { return nil }

// SetDown plays a broker outage: while down, every publish fails as unavailable.
func (b *Broker) SetDown(down bool) {
	b.mu.Lock()
	b.down = down
	b.mu.Unlock()
}

// Refuse makes the broker refuse every message of key, permanently (as invalid) or
// not (as a failure worth retrying); RefuseNone lifts it.
func (b *Broker) Refuse(key string, permanent bool) {
	b.mu.Lock()
	b.refuse[key] = permanent
	b.mu.Unlock()
}

// RefuseNone stops refusing key.
func (b *Broker) RefuseNone(key string) {
	b.mu.Lock()
	delete(b.refuse, key)
	b.mu.Unlock()
}

// Messages returns a copy of every stored message in arrival order.
func (b *Broker) Messages() []broker.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]broker.Message(nil), b.msgs...)
}

// Duplicates is how many messages were dropped as duplicates.
func (b *Broker) Duplicates() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dups
}

// Wait blocks until at least n messages are stored on topic ("" for any topic) or
// ctx ends, and returns them in arrival order.
func (b *Broker) Wait(ctx context.Context, topic string, n int) ([]broker.Message, error) {
	for {
		b.mu.Lock()
		got := b.onTopic(topic)
		if len(got) >= n {
			b.mu.Unlock()
			return got, nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return got, fmt.Errorf("memory broker: waiting for %d messages, have %d: %w", n, len(got), ctx.Err())
		}
	}
}

func (b *Broker) onTopic(topic string) []broker.Message {
	var out []broker.Message
	for _, m := range b.msgs {
		if topic == "" || m.Topic == topic {
			out = append(out, m)
		}
	}
	return out
}
