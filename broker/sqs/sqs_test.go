package sqs_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/broker/sqs/sqsemu"
	"github.com/outboxd/outbox/cloudevents"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the broker suite on FIFO queues of the SQS emulator.
func TestConformance(t *testing.T) {
	endpoint := sqsemu.Start(t)
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		c := sqsemu.Client(endpoint)
		p, err := sqs.New(c, &sqs.Config{CreateQueues: true, MaxMessageBytes: 4096})
		if err != nil {
			t.Fatal(err)
		}
		return &brokertest.Harness{
			CloudEvents: cloudevents.SQS,
			Publisher:   p,
			Topic:       func(*testing.T) string { return brokertest.UniqueName("bt-") + ".fifo" },
			Read:        sqsemu.NewReader(c, sqs.DecodeMessage).Read,
		}
	})
}

func publish(t *testing.T, p *sqs.Publisher, msgs ...broker.Message) []broker.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return p.Publish(ctx, msgs)
}

// TestClasses: a missing queue defers its events (other queues go on); an invalid
// queue name is the message's fault, and holds its key.
func TestClasses(t *testing.T) {
	c := sqsemu.Client(sqsemu.Start(t))
	made, err := sqs.New(c, &sqs.Config{CreateQueues: true})
	if err != nil {
		t.Fatal(err)
	}
	good := brokertest.UniqueName("ok-") + ".fifo"
	publish(t, made, broker.Message{ID: "x", Topic: good, Key: "k", Payload: []byte("{}")})
	p, _ := sqs.New(c, nil)
	res := publish(t, p,
		broker.Message{ID: "a", Topic: "missing.fifo", Key: "k", Payload: []byte("{}")},
		broker.Message{ID: "b", Topic: "bad.name.fifo", Key: "j", Payload: []byte("{}")},
		broker.Message{ID: "c", Topic: good, Key: "i", Payload: []byte("{}")},
		broker.Message{ID: "d", Topic: "missing.fifo", Key: "h", Payload: []byte("{}")},
	)
	if !broker.IsDeferred(res[0].Err) || !broker.IsDeferred(res[3].Err) {
		t.Errorf("missing queue: %v / %v, want deferred", res[0].Err, res[3].Err)
	}
	if !broker.IsPermanent(res[1].Err) {
		t.Errorf("invalid queue name: %v, want permanent", res[1].Err)
	}
	if res[2].Err != nil {
		t.Errorf("a good queue beside them: %v", res[2].Err)
	}
}

// TestWhatSQSCannotCarry: binary and empty payloads, more headers than SQS's ten
// attributes, header names SQS refuses, and keys and ids SQS would not take as group
// and dedup ids all arrive intact (encoded, packed or hashed), in order per key.
func TestWhatSQSCannotCarry(t *testing.T) {
	c := sqsemu.Client(sqsemu.Start(t))
	p, _ := sqs.New(c, &sqs.Config{CreateQueues: true})
	q := brokertest.UniqueName("enc-") + ".fifo"
	many := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		many[k] = "v-" + k
	}
	longKey := "order with spaces é " + strings.Repeat("x", 200)
	msgs := []broker.Message{
		{ID: "m1", Topic: q, Key: "k", Payload: []byte{0, 1, 2, 0xff}},
		{ID: "m2", Topic: q, Key: "k", Payload: []byte{}},
		{ID: "m3", Topic: q, Key: "k", PayloadNull: true},
		{ID: "m4", Topic: q, Key: "k", Payload: []byte(`{}`), Headers: many},
		{ID: "m5", Topic: q, Key: "k", Payload: []byte(`{}`), Headers: map[string]string{"AWS.trace": "x", "empty": "", "bad name": "y"}},
		{ID: "id with spaces " + strings.Repeat("y", 200), Topic: q, Key: longKey, AggregateID: longKey, Payload: []byte(`{"n":1}`)},
		{ID: "m7", Topic: q, Key: longKey, AggregateID: longKey, Payload: []byte(`{"n":2}`)},
	}
	for i, r := range publish(t, p, msgs...) {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := sqsemu.NewReader(c, sqs.DecodeMessage).Read(ctx, q, len(msgs))
	if err != nil {
		t.Fatalf("read %d: %v", len(got), err)
	}
	byID := map[string]broker.Message{}
	var order []string
	for _, m := range got {
		byID[m.ID] = m
		if m.Key == longKey {
			order = append(order, string(m.Payload))
		}
	}
	if string(byID["m1"].Payload) != "\x00\x01\x02\xff" || len(byID["m2"].Payload) != 0 || !byID["m3"].PayloadNull {
		t.Errorf("payloads: %q %q %v", byID["m1"].Payload, byID["m2"].Payload, byID["m3"].PayloadNull)
	}
	if byID["m4"].Headers["h"] != "v-h" || byID["m4"].Headers["a"] != "v-a" {
		t.Errorf("eight headers and the wire-format ones (over ten): %v", byID["m4"].Headers)
	}
	if h := byID["m5"].Headers; h["AWS.trace"] != "x" || h["empty"] != "" || h["bad name"] != "y" {
		t.Errorf("headers SQS refuses as attributes: %v", h)
	}
	if strings.Join(order, ",") != `{"n":1},{"n":2}` {
		t.Errorf("a key SQS would not take as a group id: order %v", order)
	}
}

// TestRefusedEntry: an entry SQS refuses as the sender's fault (over the queue's own
// MaximumMessageSize, smaller than the publisher's limit) is that message's
// permanent failure; its key's later message is held back, other keys go through.
func TestRefusedEntry(t *testing.T) {
	c := sqsemu.Client(sqsemu.Start(t))
	q := brokertest.UniqueName("small-") + ".fifo"
	if _, err := c.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(q),
		Attributes: map[string]string{"FifoQueue": "true", "MaximumMessageSize": "1024"}}); err != nil {
		t.Fatal(err)
	}
	p, _ := sqs.New(c, nil)
	res := publish(t, p,
		broker.Message{ID: "big", Topic: q, Key: "a", Payload: []byte(`"` + strings.Repeat("x", 2000) + `"`)},
		broker.Message{ID: "small", Topic: q, Key: "b", Payload: []byte(`{}`)},
		broker.Message{ID: "after", Topic: q, Key: "a", Payload: []byte(`{}`)},
	)
	if !broker.IsPermanent(res[0].Err) || res[1].Err != nil || !broker.IsHeldBack(res[2].Err) {
		t.Fatalf("results: %v / %v / %v; want permanent, ok, held back", res[0].Err, res[1].Err, res[2].Err)
	}
}

// TestUnreachable: no SQS at the endpoint is the connection's failure, never a
// message's.
func TestUnreachable(t *testing.T) {
	p, _ := sqs.New(sqsemu.Client("http://127.0.0.1:1"), nil)
	for i, r := range publish(t, p,
		broker.Message{ID: "a", Topic: "q.fifo", Key: "k", Payload: []byte("{}")},
		broker.Message{ID: "b", Topic: "r.fifo", Key: "j", Payload: []byte("{}")},
	) {
		if !broker.IsUnavailable(r.Err) {
			t.Errorf("message %d: %v, want unavailable", i, r.Err)
		}
	}
}

// TestWholeBatchRefusalSplit: when SQS refuses a whole batch for what is in it (here
// BatchRequestTooLong: four messages of 400 KB, each within the queue's 1 MiB, over
// 1 MiB together, as a publisher set above SQS's batch limit packs them), the
// publisher sends the entries one by one instead of charging all of them.
func TestWholeBatchRefusalSplit(t *testing.T) {
	c := sqsemu.Client(sqsemu.Start(t))
	q := brokertest.UniqueName("total-") + ".fifo"
	if _, err := c.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(q),
		Attributes: map[string]string{"FifoQueue": "true", "MaximumMessageSize": "1048576"}}); err != nil {
		t.Fatal(err)
	}
	p, _ := sqs.New(c, &sqs.Config{MaxMessageBytes: 2 << 20})
	var msgs []broker.Message
	for i := range 4 {
		msgs = append(msgs, broker.Message{ID: fmt.Sprint("m", i), Topic: q, Key: fmt.Sprint("k", i), Payload: []byte(`"` + strings.Repeat("x", 400_000) + `"`)})
	}
	for i, r := range publish(t, p, msgs...) {
		if r.Err != nil {
			t.Errorf("message %d (fits the queue on its own): %v", i, r.Err)
		}
	}
}

// TestSilentEndpointIsUnavailable: an SQS endpoint that takes the connection and
// never answers (a black hole) makes a publish return within Config.Timeout, each
// message unavailable (no attempt spent), instead of waiting for ever.
func TestSilentEndpointIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	defer func() {
		_ = ln.Close()
		<-accepted
		for _, c := range held {
			_ = c.Close()
		}
	}()
	p, err := sqs.New(sqsemu.Client("http://"+ln.Addr().String()), &sqs.Config{Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range publish(t, p, broker.Message{ID: "a", Topic: "silent.fifo", Key: "k", Payload: []byte("{}")}) {
		if !broker.IsUnavailable(res.Err) {
			t.Fatalf("message %d to a silent endpoint: %v, want unavailable", i, res.Err)
		}
	}
}
