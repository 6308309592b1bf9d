package pgmessage_test

import (
	"fmt"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/pgmessage"
)

// The table-less mode's message content: a JSON line with the event's metadata, then
// the payload bytes as they will be published.
func ExampleEncode() {
	content, err := pgmessage.Encode(&outboxdriver.InsertEvent{
		ID: "0190d2a4-5b6c-7d8e-9f00-112233445566", AggregateType: "order", AggregateID: "42",
		Type: "OrderPlaced", Payload: []byte(`{"eventVersion":1,"total":990}`),
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s\n", content)
	row, _, err := pgmessage.Decode(content)
	if err != nil {
		panic(err)
	}
	fmt.Println(row.AggregateType, row.AggregateID, row.Type, string(row.Payload))
	// Output:
	// {"id":"0190d2a4-5b6c-7d8e-9f00-112233445566","aggregatetype":"order","aggregateid":"42","type":"OrderPlaced"}
	// {"eventVersion":1,"total":990}
	// order 42 OrderPlaced {"eventVersion":1,"total":990}
}
