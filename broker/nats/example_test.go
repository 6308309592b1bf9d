package nats_test

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/broker"
	natspub "github.com/outboxd/outbox/broker/nats"
)

// A publisher on a JetStream context the service owns. The relay calls Publish with
// each batch; each message gets the event id as its Nats-Msg-Id, so JetStream drops
// a repeat within the stream's duplicate window.
func Example() {
	nc, err := nats.Connect("nats://nats:4222")
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	pub, err := natspub.New(js, &natspub.Config{})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	results := pub.Publish(context.Background(), []broker.Message{{
		ID: "0192f0c4-0000-7000-8000-000000000001", Topic: "outbox.event.order", Key: "42",
		EventType: "OrderPlaced", AggregateType: "order", AggregateID: "42", Payload: []byte(`{"total":990}`),
	}})
	fmt.Println(results[0].Err)
}
