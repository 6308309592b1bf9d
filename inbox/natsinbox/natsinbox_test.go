package natsinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/inbox/inboxtest"
	"github.com/outboxd/outbox/inbox/natsinbox"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEndToEnd: events published by the NATS publisher, one of them delivered twice
// by the broker and one failing its first handling, are each applied exactly once.
func TestEndToEnd(t *testing.T) {
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := testenv.UniqueName("inboxtest")
	js, stream := natstest.CreateStream(t, url, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}})
	pub, err := natspub.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := []broker.Message{
		{ID: "e1", Topic: prefix + ".order", Key: "1", EventType: "T", AggregateType: "order", AggregateID: "1", Seq: 1, Payload: []byte(`{}`)},
		{ID: "e2", Topic: prefix + ".order", Key: "1", EventType: "T", AggregateType: "order", AggregateID: "1", Seq: 2, Payload: []byte(`{}`)},
		{ID: "e3", Topic: prefix + ".order", Key: "2", EventType: "T", AggregateType: "order", AggregateID: "2", Seq: 3, Payload: []byte(`{}`)},
	}
	for _, r := range pub.Publish(ctx, msgs) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// A duplicate the broker's dedup does not catch (another Nats-Msg-Id, same event).
	dup := nats.NewMsg(prefix + ".order")
	dup.Header.Set("id", "e2")
	dup.Header.Set("aggregateId", "1")
	dup.Header.Set("outbox-seq", "2")
	dup.Header.Set(jetstream.MsgIDHeader, "e2-again")
	if _, err := js.PublishMsg(ctx, dup); err != nil {
		t.Fatal(err)
	}
	// A message with no event id can never be deduplicated: terminated, not
	// redelivered in a loop.
	noID := nats.NewMsg(prefix + ".order")
	noID.Header.Set(jetstream.MsgIDHeader, "")
	noID.Data = []byte(`{}`)
	if _, err := js.PublishMsg(ctx, noID); err != nil {
		t.Fatal(err)
	}
	env := inboxtest.New(t, "e3") // the only event of its aggregate: a retry is not stale
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	logs, logger := inboxtest.NewLogCounter()
	go func() {
		done <- natsinbox.Consume(cctx, cons, env.IB, "billing", env.Handler, &inbox.ConsumeOptions{Logger: logger})
	}()
	env.Wait(t, "e1", "e2", "e3")
	// Nothing left that could come again: every message acknowledged or
	// terminated (the id-less one), none pending at the consumer.
	testenv.Wait(t, ctx, "nothing pending at the consumer", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := logs.Count("inbox: message failed permanently; not redelivered"); n != 1 {
		t.Fatalf("the id-less message failed permanently %d times, want once (terminated)", n)
	}
	if n := logs.Count("inbox: handler failed; the message comes again"); n != 1 {
		t.Fatalf("%d retried failures logged, want 1 (e3's first delivery)", n)
	}
}
