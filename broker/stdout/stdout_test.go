package stdout_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/stdout"
	"github.com/outboxd/outbox/cloudevents"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) lines() []stdout.Line {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []stdout.Line
	sc := bufio.NewScanner(bytes.NewReader(b.b.Bytes()))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var l stdout.Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			panic(err)
		}
		out = append(out, l)
	}
	return out
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		buf := &buffer{}
		return &brokertest.Harness{
			CloudEvents: cloudevents.Stdout,
			Publisher:   stdout.New(buf),
			Topic:       func(*testing.T) string { return brokertest.UniqueName("outbox.event.t") },
			Read: func(ctx context.Context, topic string, n int) ([]broker.Message, error) {
				for {
					var got []broker.Message
					for _, l := range buf.lines() {
						if l.Topic == topic {
							p := []byte(l.Payload)
							if l.PayloadBase64 != nil {
								p = l.PayloadBase64
							}
							got = append(got, broker.Message{ID: l.ID, Topic: l.Topic, Key: l.Key, Payload: p, Headers: l.Headers})
						}
					}
					if len(got) >= n {
						return got[:n], nil
					}
					select {
					case <-ctx.Done():
						return got, fmt.Errorf("have %d of %d: %w", len(got), n, ctx.Err())
					case <-time.After(5 * time.Millisecond):
					}
				}
			},
		}
	})
}
