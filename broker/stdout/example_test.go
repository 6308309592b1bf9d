package stdout_test

import (
	"context"
	"os"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/stdout"
)

// Watch what a relay would publish, one JSON line a message, with the wire format's
// headers: `outbox relay --broker stdout:` does this.
func Example() {
	pub := stdout.New(os.Stdout)
	pub.Publish(context.Background(), []broker.Message{{
		ID: "0192f0c4-0000-7000-8000-000000000001", Topic: "outbox.event.order", Key: "42",
		EventType: "OrderPlaced", AggregateType: "order", AggregateID: "42", Payload: []byte(`{"total":990}`),
	}})
	// Output:
	// {"id":"0192f0c4-0000-7000-8000-000000000001","topic":"outbox.event.order","key":"42","headers":{"aggregateId":"42","aggregateType":"order","eventType":"OrderPlaced","id":"0192f0c4-0000-7000-8000-000000000001"},"payload":{"total":990}}
}
