package memory_test

import (
	"context"
	"fmt"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
)

// The in-memory publisher passes the same conformance suite as the real ones, so a
// service's tests can run its relay against it: keys keep their order, a message over
// the size limit is refused for good, and a key can be made to fail on purpose.
func Example() {
	b := memory.New(64)
	ctx := context.Background()
	msg := func(id, key, payload string) broker.Message {
		return broker.Message{ID: id, Topic: "outbox.event.order", Key: key, Payload: []byte(payload)}
	}
	b.Refuse("7", false) // key 7's broker refuses for now: retry later
	res := b.Publish(ctx, []broker.Message{
		msg("e1", "42", `{"n":1}`),
		msg("e2", "7", `{"n":1}`),
		msg("e3", "42", `{"pad":"`+string(make([]byte, 100))+`"}`),
	})
	for i, r := range res {
		fmt.Printf("e%d: published %v, permanent %v\n", i+1, r.Err == nil, broker.IsPermanent(r.Err))
	}
	fmt.Println(len(b.Messages()), "message stored")
	// Output:
	// e1: published true, permanent false
	// e2: published false, permanent false
	// e3: published false, permanent true
	// 1 message stored
}
