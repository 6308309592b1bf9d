package debezium_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/outboxdriver"
)

// Route an outbox row as Debezium's Outbox Event Router would, from the same options
// a connector config holds: here the topic from the aggregate type with a prefix of
// one's own, and the event type as a header beside the event id.
func Example() {
	r, err := debezium.New(&debezium.Config{Options: map[string]string{
		"route.topic.replacement":           "events.${routedByValue}",
		"table.fields.additional.placement": "type:header:eventType",
	}})
	if err != nil {
		panic(err)
	}
	m, err := r.Route(&outboxdriver.Row{
		Seq: 1, ID: "0192f0c4-0000-7000-8000-000000000001", AggregateType: "order", AggregateID: "42",
		Type: "OrderPlaced", Payload: []byte(`{"total":990}`), CreatedAt: time.Unix(1765000000, 0),
	}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("topic:", m.Topic)
	fmt.Println("key:", m.Key)
	fmt.Println("value:", string(m.Payload))
	var headers []string
	m.EachHeader(func(k, v string) { headers = append(headers, k+"="+v) })
	slices.Sort(headers)
	fmt.Println("headers:", headers)
	// Output:
	// topic: events.order
	// key: 42
	// value: {"total":990}
	// headers: [eventType=OrderPlaced id=0192f0c4-0000-7000-8000-000000000001]
}
