package sqsinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/broker/sqs/sqsemu"
	"github.com/outboxd/outbox/inbox/inboxtest"
	"github.com/outboxd/outbox/inbox/sqsinbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEndToEnd: events published by the SQS publisher to a FIFO queue (on the
// emulator), one twice and one failing its first handling, are applied once each;
// the failed one comes again after its pause.
func TestEndToEnd(t *testing.T) {
	c := sqsemu.Client(sqsemu.Start(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	q, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String("inboxtest-order.fifo"),
		Attributes: map[string]string{"FifoQueue": "true", "VisibilityTimeout": "5"}})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := sqs.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := func(id, agg string, seq int64) broker.Message {
		return broker.Message{ID: id, Topic: "inboxtest-order.fifo", Key: agg, EventType: "T", AggregateType: "order", AggregateID: agg, Seq: seq, Payload: []byte(`{}`)}
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
		done <- sqsinbox.Consume(cctx, c, aws.ToString(q.QueueUrl), env.IB, "billing", env.Handler, nil)
	}()
	env.Wait(t, "e1", "e2", "e3")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
