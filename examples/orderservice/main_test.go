package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// TestExample runs the example against the machine's PostgreSQL and NATS, in a schema
// and stream of its own, and reads its event back from the stream.
func TestExample(t *testing.T) {
	url := testenv.DatabaseURL(t)
	natsURL := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := testenv.UniqueName("orderservice")
	t.Cleanup(func() { natstest.DeleteStream(natsURL, stream) })
	id, err := run(ctx, url, natsURL, setup{schema: testenv.Schema(t, url), topics: stream + ".${aggregatetype}", stream: stream})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := natstest.Read(ctx, natsURL, stream, stream+".order", 1)
	if err != nil {
		t.Fatal(err)
	}
	if msgs[0].Key != fmt.Sprint(id) || msgs[0].Headers["eventType"] != "OrderPlaced" {
		t.Fatalf("published %+v, want order %d's OrderPlaced", msgs[0], id)
	}
}
