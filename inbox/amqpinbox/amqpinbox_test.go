package amqpinbox_test

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/inbox/amqpinbox"
	"github.com/outboxd/outbox/inbox/inboxtest"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEndToEnd: events published by the RabbitMQ publisher, one published twice
// (RabbitMQ has no dedup) and one failing its first handling, are applied once each.
func TestEndToEnd(t *testing.T) {
	url := testenv.ServiceURL(t, "TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "127.0.0.1:5672", "RabbitMQ")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exchange := testenv.UniqueName("inboxtest.")
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	_ = ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil)
	defer ch.ExchangeDelete(exchange, false, false)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = ch.QueueBind(q.Name, "#", exchange, false, nil)
	pub, err := amqp.Dial(ctx, url, &amqp.Config{Exchange: exchange})
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
	deliveries, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- amqpinbox.Consume(cctx, deliveries, env.IB, "billing", env.Handler, nil) }()
	env.Wait(t, "e1", "e2", "e3")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
