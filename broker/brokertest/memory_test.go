package brokertest_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/cloudevents"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformanceMemory: the in-memory broker, which many tests stand on, meets the
// suite (and the suite is run where it lives).
func TestConformanceMemory(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		b := memory.New(4096)
		return &brokertest.Harness{
			CloudEvents: cloudevents.NATS,
			Publisher:   b,
			Topic:       func(*testing.T) string { return brokertest.UniqueName("outbox.event.t") },
			Read: func(ctx context.Context, topic string, n int) ([]broker.Message, error) {
				msgs, err := b.Wait(ctx, topic, n)
				if len(msgs) > n {
					msgs = msgs[:n]
				}
				return msgs, err
			},
			Restart: func(*testing.T) { b.SetDown(true); b.SetDown(false) },
		}
	})
}
