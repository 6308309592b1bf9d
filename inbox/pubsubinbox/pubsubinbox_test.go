package pubsubinbox_test

import (
	"context"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"go.uber.org/goleak"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/pubsub"
	"github.com/outboxd/outbox/inbox/inboxtest"
	"github.com/outboxd/outbox/inbox/pubsubinbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The Pub/Sub client's OpenCensus and gRPC workers outlive a test.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		// Receive's stream keep-alive ends on its own ticker after Receive returned.
		goleak.IgnoreTopFunction("cloud.google.com/go/pubsub/v2.(*messageIterator).streamKeepAliveHandler"),
	)
}

// TestEndToEnd: events published by the Pub/Sub publisher (on Pub/Sub's own fake,
// pstest), one twice and one failing its first handling, are applied once each; the
// failed one comes again after its nack.
func TestEndToEnd(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := gpubsub.NewClient(ctx, "outbox-test", option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const topic = "projects/outbox-test/topics/inboxtest.order"
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/outbox-test/subscriptions/billing", Topic: topic, EnableMessageOrdering: true, AckDeadlineSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	pub, err := pubsub.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	e := func(id, agg string, seq int64) broker.Message {
		return broker.Message{ID: id, Topic: "inboxtest.order", Key: agg, EventType: "T", AggregateType: "order", AggregateID: agg, Seq: seq, Payload: []byte(`{}`)}
	}
	for _, r := range pub.Publish(ctx, []broker.Message{e("e1", "1", 1), e("e2", "1", 2), e("e2", "1", 2), e("e3", "2", 3)}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	env := inboxtest.New(t, "e3")
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- pubsubinbox.Consume(cctx, c.Subscriber("billing"), env.IB, "billing", env.Handler, nil)
	}()
	env.Wait(t, "e1", "e2", "e3")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
