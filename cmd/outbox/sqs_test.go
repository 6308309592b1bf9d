package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxd/outbox/broker"
	sqspub "github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/broker/sqs/sqsemu"
	"github.com/outboxd/outbox/internal/testenv"
)

// fifoQueues makes FIFO queues on the emulator (queues are made by their owners: the
// relay defers the events of a missing one).
func fifoQueues(t *testing.T, endpoint string, names ...string) {
	t.Helper()
	c := sqsemu.Client(endpoint)
	for _, n := range names {
		if _, err := c.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(n),
			Attributes: map[string]string{"FifoQueue": "true"}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRelaySQS: `outbox relay --broker sqs://REGION?endpoint=...` against the SQS
// emulator, credentials from the environment as on AWS: every event published once
// to the aggregate type's FIFO queue, in write order per aggregate.
func TestRelaySQS(t *testing.T) {
	t.Parallel()
	endpoint := sqsemu.Start(t)
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	fifoQueues(t, endpoint, "outbox-event-order.fifo")
	want := writeEvents(t, pool, table, 3, 20) // 20 events over 3 aggregates
	p := startRelayProc(t, sqsemu.Env(), "--db", url, "--table", table.Schema+".outbox", "--broker", "sqs://us-east-1?endpoint="+endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs, err := sqsemu.NewReader(sqsemu.Client(endpoint), sqspub.DecodeMessage).Read(ctx, "outbox-event-order.fifo", 20)
	if err != nil {
		t.Fatalf("%d of 20 events on SQS (%v); the relay said:\n%s", len(msgs), err, p.output())
	}
	got := map[string][]string{}
	for _, m := range msgs {
		got[m.Key] = append(got[m.Key], m.Headers[broker.HeaderID])
	}
	for agg, ids := range want {
		if !slices.Equal(got[agg], ids) {
			t.Fatalf("aggregate %s: got %v, want %v", agg, got[agg], ids)
		}
	}
}

// TestVerifySQS: `outbox verify --broker sqs://...` reads the canaries back from
// their FIFO queue.
func TestVerifySQS(t *testing.T) { // not parallel: runCLI sets the environment
	endpoint := sqsemu.Start(t)
	url := testenv.DatabaseURL(t)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	fifoQueues(t, endpoint, "outbox-event-outbox_5Fverify.fifo")
	broker := "sqs://us-east-1?endpoint=" + endpoint
	startRelayProc(t, sqsemu.Env(), "--db", url, "--table", table.Schema+".outbox", "--broker", broker)
	stdout, stderr, code := runCLI(t, sqsemu.Env(), "verify", "--db", url, "--table", table.Schema+".outbox",
		"--broker", broker, "--events", "30", "--deadline", "20s")
	if code != 0 || !strings.Contains(stdout, "delivered    30 of 30") {
		t.Fatalf("verify on SQS (emulator): %d\n%s\n%s", code, stdout, stderr)
	}
}
