package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/webhook"
)

// A receiver of the relay's webhooks checks each request's signature (Standard
// Webhooks: an HMAC of the id, the timestamp and the body) before it trusts the body,
// and answers 2xx only once it has the event: anything else makes the relay send it
// again.
func Example() {
	const secret = "whsec_c2VjcmV0LWtleS1mb3ItdGhlLWV4YW1wbGU=" // from your secret store
	key, err := webhook.DecodeSecret(secret)
	if err != nil {
		panic(err)
	}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		if err := webhook.Verify(key, r.Header, body, time.Now(), 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		fmt.Printf("verified %s: %s\n", r.Header.Get(webhook.HeaderID), body)
	}))
	defer receiver.Close()

	pub, err := webhook.Dial(context.Background(), receiver.URL, &webhook.Config{Secret: secret})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	res := pub.Publish(context.Background(), []broker.Message{{
		ID: "0192f0c4-0000-7000-8000-000000000001", Topic: "outbox.event.order", Key: "42",
		EventType: "OrderPlaced", AggregateType: "order", AggregateID: "42", Payload: []byte(`{"total":990}`),
	}})
	fmt.Println("published:", res[0].Err == nil)
	// Output:
	// verified 0192f0c4-0000-7000-8000-000000000001: {"total":990}
	// published: true
}
