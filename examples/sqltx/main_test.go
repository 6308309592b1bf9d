package main

import (
	"context"
	"database/sql"
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
// and stream of its own, and reads back from the stream the events of the order
// placed with database/sql and of the one placed with GORM, in order; the failed
// GORM transaction left no row behind.
func TestExample(t *testing.T) {
	url := testenv.DatabaseURL(t)
	natsURL := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := testenv.UniqueName("sqltx")
	t.Cleanup(func() { natstest.DeleteStream(natsURL, stream) })
	schema := testenv.Schema(t, url)
	ids, err := run(ctx, url, natsURL, setup{schema: schema, topics: stream + ".${aggregatetype}", stream: stream})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := natstest.Read(ctx, natsURL, stream, stream+".order", 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		if m.Key != fmt.Sprint(ids[i]) || m.Headers["eventType"] != "OrderPlaced" {
			t.Fatalf("published %+v, want order %d's OrderPlaced", m, ids[i])
		}
	}
	// The failed GORM transaction left neither its order nor its event.
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var orders, events int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+schema+`.orders), (SELECT count(*) FROM `+schema+`.outbox)`).Scan(&orders, &events); err != nil {
		t.Fatal(err)
	}
	if orders != 2 || events != 2 {
		t.Fatalf("%d orders and %d events; want the 2 committed of each, nothing of the rolled-back GORM transaction", orders, events)
	}
}
