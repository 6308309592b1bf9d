package kafkainbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/inbox/inboxtest"
	"github.com/outboxd/outbox/inbox/kafkainbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEndToEnd, on kfake (there is no Kafka broker here): records produced by the
// Kafka publisher, one produced twice and one failing its first handling, are applied
// once each, and the group's offsets are committed.
func TestEndToEnd(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := kafka.Dial(ctx, "kafka://"+cluster.ListenAddrs()[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	e := func(id, agg string, seq int64) broker.Message {
		return broker.Message{ID: id, Topic: "outbox.event.order", Key: agg, EventType: "T", AggregateType: "order", AggregateID: agg, Seq: seq, Payload: []byte(`{}`)}
	}
	for _, r := range pub.Publish(ctx, []broker.Message{e("e1", "1", 1), e("e2", "1", 2), e("e2", "1", 2), e("e3", "2", 3)}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	env := inboxtest.New(t, "e3")
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("outbox.event.order"), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kafkainbox.Consume(cctx, cl, env.IB, "billing", env.Handler, nil) }()
	env.Wait(t, "e1", "e2", "e3")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestReadCommitted: with the relay publishing in Kafka transactions
// (kafka.TxPublisher), a consumer built with read_committed applies only what
// committed: a record of an aborted transaction, in the log between two committed
// ones of its aggregate, is never handed to the handler.
func TestReadCommitted(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	if err := cluster.CreateTopic("small", 1, map[string]string{"max.message.bytes": "100"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := kafka.DialTransactional("kafka://"+cluster.ListenAddrs()[0], &kafka.TxConfig{TransactionalID: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := pub.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	e := func(id string, seq int64) broker.Message {
		return broker.Message{ID: id, Topic: "outbox.event.order", Key: "1", EventType: "T", AggregateType: "order", AggregateID: "1", Seq: seq, Payload: []byte(`{}`)}
	}
	poison := e("poison", 9)
	poison.Topic, poison.Payload = "small", make([]byte, 500)
	for _, batch := range [][]broker.Message{{e("e1", 1), e("e2", 2)}, {e("aborted", 3), poison}, {e("e3", 4)}} {
		res := pub.Publish(ctx, batch)
		if batch[0].ID == "aborted" {
			if !broker.IsHeldBack(res[0].Err) || !broker.IsPermanent(res[1].Err) {
				t.Fatalf("the transaction with a refused record: %v, %v; want it aborted", res[0].Err, res[1].Err)
			}
			continue
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	env := inboxtest.New(t, "")
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("outbox.event.order"), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kafkainbox.Consume(cctx, cl, env.IB, "billing", env.Handler, nil) }()
	env.Wait(t, "e1", "e2", "e3") // and nothing else: "aborted" came before e3
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
