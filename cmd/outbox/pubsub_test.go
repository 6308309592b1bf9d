package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/testenv"
)

// TestRelayPubSub: `outbox relay --broker pubsub://PROJECT` against Pub/Sub's own fake
// (pstest, reached as an emulator through PUBSUB_EMULATOR_HOST): every event published
// once, with its aggregate id as the ordering key, in write order per aggregate.
func TestRelayPubSub(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := fakePubSub(ctx, t, "outbox.event.order")
	want := writeEvents(t, pool, table, 3, 20) // 20 events over 3 aggregates
	p := startRelayProc(t, []string{"PUBSUB_EMULATOR_HOST=" + srv.Addr}, "--db", url, "--table", table.Schema+".outbox", "--broker", "pubsub://outbox-test")
	var got map[string][]string
	n := 0
	testenv.WaitTell(t, ctx, "20 events on Pub/Sub", func() bool {
		got, n = map[string][]string{}, 0
		for _, m := range srv.Messages() {
			got[m.OrderingKey] = append(got[m.OrderingKey], m.Attributes[broker.HeaderID])
			n++
		}
		return n >= 20
	}, func() string { return fmt.Sprintf("%d of 20 arrived; the relay said:\n%s", n, p.output()) })
	for agg, ids := range want {
		if !slices.Equal(got[agg], ids) {
			t.Fatalf("aggregate %s: got %v, want %v", agg, got[agg], ids)
		}
	}
}

// TestVerifyPubSub: `outbox verify --broker pubsub://PROJECT` reads the canaries back
// through a subscription of its own (on pstest as an emulator).
func TestVerifyPubSub(t *testing.T) {
	url := testenv.DatabaseURL(t)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := fakePubSub(ctx, t, "outbox.event.outbox_verify")
	emulator := "PUBSUB_EMULATOR_HOST=" + srv.Addr
	startRelayProc(t, []string{emulator}, "--db", url, "--table", table.Schema+".outbox", "--broker", "pubsub://outbox-test")
	stdout, stderr, code := runCLI(t, []string{emulator}, "verify", "--db", url, "--table", table.Schema+".outbox",
		"--broker", "pubsub://outbox-test", "--events", "30", "--deadline", "20s")
	if code != 0 || !strings.Contains(stdout, "delivered    30 of 30") {
		t.Fatalf("verify on Pub/Sub (pstest): %d\n%s\n%s", code, stdout, stderr)
	}
}

// fakePubSub starts Pub/Sub's own fake (pstest) with project outbox-test's topics made
// (topics are made by their owners: the relay defers events of a missing one).
func fakePubSub(ctx context.Context, t *testing.T, topics ...string) *pstest.Server {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := gpubsub.NewClient(ctx, "outbox-test", option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, topic := range topics {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/outbox-test/topics/" + topic}); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}
