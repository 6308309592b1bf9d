package pubsub_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"go.uber.org/goleak"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/pubsub"
	"github.com/outboxd/outbox/cloudevents"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The Google client's gRPC and OpenCensus background workers outlive a test.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

// fake is Pub/Sub's own in-process fake (pstest) and a publisher connected to it.
func fake(t *testing.T, cfg *pubsub.Config, opts ...pstest.ServerReactorOption) (*pstest.Server, *pubsub.Publisher) {
	t.Helper()
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p, err := pubsub.Dial(context.Background(), "pubsub://outbox-test", cfg, option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return srv, p
}

// read returns what the fake stored on topic, in publish order, as broker messages.
func read(srv *pstest.Server, topic string) []broker.Message {
	var out []broker.Message
	for _, m := range srv.Messages() {
		if !strings.HasSuffix(m.Topic, "/topics/"+topic) {
			continue
		}
		out = append(out, broker.Message{ID: m.Attributes[broker.HeaderID], Topic: topic, Key: m.OrderingKey, Payload: m.Data, Headers: m.Attributes})
	}
	return out
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		srv, p := fake(t, &pubsub.Config{CreateTopics: true, MaxMessageBytes: 4096})
		return &brokertest.Harness{
			CloudEvents: cloudevents.PubSub,
			Publisher:   p,
			Topic:       func(*testing.T) string { return brokertest.UniqueName("outbox.test.") },
			Read: func(ctx context.Context, topic string, n int) ([]broker.Message, error) {
				for {
					got := read(srv, topic)
					if len(got) >= n {
						return got[:n], nil
					}
					select {
					case <-ctx.Done():
						return got, ctx.Err()
					case <-time.After(10 * time.Millisecond):
					}
				}
			},
		}
	})
}

// TestClasses: without CreateTopics, a missing topic defers its events
// (other topics go on); an invalid topic id or attribute is the message's fault.
func TestClasses(t *testing.T) {
	_, p := fake(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := p.Publish(ctx, []broker.Message{
		{ID: "a", Topic: "outbox.missing", Key: "k", Payload: []byte("{}")},
		{ID: "b", Topic: "goog-reserved", Key: "j", Payload: []byte("{}")},
		{ID: "c", Topic: "outbox.other", Key: "i", Payload: []byte("{}"), Headers: map[string]string{"googly": "x"}},
	})
	if !broker.IsDeferred(res[0].Err) {
		t.Errorf("missing topic: %v", res[0].Err)
	}
	if !broker.IsPermanent(res[1].Err) || !broker.IsPermanent(res[2].Err) {
		t.Errorf("invalid topic / attribute: %v / %v", res[1].Err, res[2].Err)
	}
}

// failKey fails the publish requests carrying a message of ordering key "bad" while on.
type failKey struct{ on atomic.Bool }

func (f *failKey) React(req any) (bool, any, error) {
	if r, ok := req.(*pubsubpb.PublishRequest); ok && f.on.Load() {
		for _, m := range r.Messages {
			if m.OrderingKey == "bad" {
				return true, nil, status.Error(codes.FailedPrecondition, "injected failure")
			}
		}
	}
	return false, nil, nil
}

// TestFailedKeyHeldAndResumed: a failed publish pauses its key in the client; the
// key's later messages come back held back (not sent, no attempt), other keys go
// on, and once the failure is gone the same messages go through in order.
func TestFailedKeyHeldAndResumed(t *testing.T) {
	f := &failKey{}
	f.on.Store(true)
	srv, p := fake(t, &pubsub.Config{CreateTopics: true}, pstest.ServerReactorOption{FuncName: "Publish", Reactor: f})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	batch := []broker.Message{
		{ID: "b1", Topic: "outbox.held", Key: "bad", Payload: []byte("{}")},
		{ID: "b2", Topic: "outbox.held", Key: "bad", Payload: []byte("{}")},
		{ID: "g1", Topic: "outbox.held", Key: "good", Payload: []byte("{}")},
	}
	res := p.Publish(ctx, batch)
	if res[0].Err == nil || broker.IsHeldBack(res[0].Err) || !broker.IsHeldBack(res[1].Err) || res[2].Err != nil {
		t.Fatalf("with the key failing: %v / %v / %v", res[0].Err, res[1].Err, res[2].Err)
	}
	f.on.Store(false)
	for i, r := range p.Publish(ctx, batch[:2]) {
		if r.Err != nil {
			t.Fatalf("after the failure, message %d: %v", i, r.Err)
		}
	}
	var ids []string
	for _, m := range read(srv, "outbox.held") {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "g1,b1,b2" {
		t.Fatalf("stored %v", ids)
	}
}
