package broker_test

import (
	"fmt"

	"github.com/outboxd/outbox/broker"
)

// Topic templates say where an event goes, from its aggregate type and event type:
// outbox.event.${aggregatetype} is the default, as Debezium's router has it.
func ExampleParseTemplate() {
	for _, s := range []string{broker.TopicTemplateDefault, "orders.${type}", "${aggregatetype}.${nope}"} {
		t, err := broker.ParseTemplate(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(t.Execute(broker.TopicFields{AggregateType: "order", Type: "OrderPlaced"}, nil))
	}
	// Output:
	// outbox.event.order
	// orders.OrderPlaced
	// topic template "${aggregatetype}.${nope}": unknown placeholder ${nope} (want ${aggregatetype} or ${type})
}

// The wire format's headers of a message, as every publisher sends them (NATS and
// Kafka headers, AMQP properties, webhook headers): names as Debezium's router
// writes them, and the relay's own beside them when they apply.
func ExampleMessage_EachHeader() {
	m := broker.Message{
		ID: "0192f0c4-0000-7000-8000-000000000001", Topic: "outbox.event.order", Key: "42",
		EventType: "OrderPlaced", AggregateType: "order", AggregateID: "42", Payload: []byte(`{"total":990}`),
		Seq: 7, Headers: map[string]string{"correlation-id": "req-7"},
	}
	m.EachHeader(func(name, value string) { fmt.Printf("%s: %s\n", name, value) })
	// Output:
	// id: 0192f0c4-0000-7000-8000-000000000001
	// eventType: OrderPlaced
	// aggregateType: order
	// aggregateId: 42
	// outbox-seq: 7
	// correlation-id: req-7
}
