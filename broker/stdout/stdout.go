// Package stdout writes outbox events as JSON lines, for debugging pipelines
// (`outbox relay --broker stdout:`). It keeps order and never refuses a message.
package stdout

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/outboxd/outbox/broker"
)

// Line is one message as written.
type Line struct {
	ID      string            `json:"id"`
	Topic   string            `json:"topic"`
	Key     string            `json:"key"`
	Headers map[string]string `json:"headers"`
	// Payload is the payload when it is JSON; otherwise PayloadBase64 holds it.
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
}

// Publisher writes to an io.Writer.
type Publisher struct {
	mu sync.Mutex
	w  io.Writer
}

// New returns a publisher writing to w (os.Stdout for the CLI).
func New(w io.Writer) *Publisher { return &Publisher{w: w} }

var _ broker.Publisher = (*Publisher)(nil)

// Publish implements broker.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	return broker.Sequence(ctx, msgs, broker.Schedule{}, broker.Sender{
		Prepare: func(context.Context, int) error { return nil },
		Send: func(_ context.Context, i int) (broker.Future, error) {
			m := &msgs[i]
			l := Line{ID: m.ID, Topic: m.Topic, Key: m.Key, Headers: make(map[string]string, m.HeaderCount())}
			m.EachHeader(func(k, v string) { l.Headers[k] = v })
			if len(m.Payload) > 0 && json.Valid(m.Payload) {
				l.Payload = m.Payload
			} else {
				l.PayloadBase64 = m.Payload
			}
			b, err := json.Marshal(l)
			if err == nil {
				_, err = p.w.Write(append(b, '\n'))
			}
			if err != nil {
				return nil, broker.Unavailable(fmt.Errorf("stdout: %w", err))
			}
			return broker.Answered{}, nil
		},
	})
}

// Features implements broker.Publisher.
func (p *Publisher) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true}
}

// Close implements broker.Publisher.
func (p *Publisher) Close() error { return nil }
