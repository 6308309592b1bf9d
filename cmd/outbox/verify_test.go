package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxd/outbox/broker"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

// TestVerify: `outbox verify` passes against a running relay (NATS and Redis), and
// fails with a report of the lost events when no relay runs.
func TestVerify(t *testing.T) {
	url := testenv.DatabaseURL(t)
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
		ns := newNATSScope(t)
		args := []string{"verify", "--db", url, "--table", table.Schema + ".outbox", "--broker", ns.url, "--topic-template", ns.template(),
			"--events", "60", "--aggregates", "6", "--deadline", "2s"}
		// No relay yet: nothing arrives.
		stdout, stderr, code := runCLI(t, nil, args...)
		if code != 1 || !strings.Contains(stdout, "lost         60") || !strings.Contains(stdout, "FAILED") || !strings.Contains(stderr, "0 of 60 delivered") {
			t.Fatalf("verify without a relay: %d\n%s\n%s", code, stdout, stderr)
		}
		startRelayProc(t, nil, "--db", url, "--table", table.Schema+".outbox", "--broker", ns.url, "--topic-template", ns.template())
		args[len(args)-1] = "30s"
		stdout, stderr, code = runCLI(t, nil, args...)
		if code != 0 || !strings.Contains(stdout, "delivered    60 of 60") || !strings.Contains(stdout, "OK") {
			t.Fatalf("verify with the relay: %d\n%s\n%s", code, stdout, stderr)
		}
	})
	t.Run("nats-create-stream", func(t *testing.T) {
		// A NATS server without the stream, and a relay that creates it on its first
		// publish: verify waits for the stream instead of refusing.
		t.Parallel()
		ns, err := natsembed.Start(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ns.Stop)
		table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
		startRelayProc(t, nil, "--db", url, "--table", table.Schema+".outbox", "--broker", ns.URL(), "--nats-create-stream")
		stdout, stderr, code := runCLI(t, nil, "verify", "--db", url, "--table", table.Schema+".outbox", "--broker", ns.URL(),
			"--events", "40", "--deadline", "30s")
		if code != 0 || !strings.Contains(stdout, "delivered    40 of 40") || !strings.Contains(stdout, "The canaries stay in") {
			t.Fatalf("verify against a relay that creates its stream: %d\n%s\n%s", code, stdout, stderr)
		}
	})
	for _, b := range []struct {
		name, env, def, addr, service string
		args                          func(unique string) []string // broker flags
	}{
		{"amqp", "TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "127.0.0.1:5672", "RabbitMQ", func(u string) []string {
			return []string{"--amqp-exchange", u, "--topic-template", "outbox.event.${aggregatetype}"}
		}},
		{"mqtt", "TEST_MQTT_URL", "mqtt://127.0.0.1:1883", "127.0.0.1:1883", "Mosquitto", func(u string) []string {
			return []string{"--topic-template", u + "/${aggregatetype}"}
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			brokerURL := testenv.ServiceURL(t, b.env, b.def, b.addr, b.service)
			table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
			flags := append([]string{"--broker", brokerURL}, b.args(testenv.UniqueName("verify"))...)
			p := startRelayProc(t, nil, append([]string{"--db", url, "--table", table.Schema + ".outbox"}, flags...)...)
			// The relay's publisher declares the exchange when it connects, before "active".
			actx, acancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer acancel()
			testenv.WaitTell(t, actx, "the relay active", func() bool { return strings.Contains(p.output(), "relay: active") }, p.output)
			args := append([]string{"verify", "--db", url, "--table", table.Schema + ".outbox", "--events", "40", "--deadline", "30s"}, flags...)
			stdout, stderr, code := runCLI(t, nil, args...)
			if code != 0 || !strings.Contains(stdout, "delivered    40 of 40") {
				t.Fatalf("verify on %s: %d\n%s\n%s", b.name, code, stdout, stderr)
			}
		})
	}
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		// No Kafka broker runs here: kfake, an in-process Kafka speaking the protocol,
		// with the canaries' topic made (the relay does not create topics).
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "outbox.event.outbox_verify"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cluster.Close)
		brokerURL := "kafka://" + cluster.ListenAddrs()[0]
		table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
		startRelayProc(t, nil, "--db", url, "--table", table.Schema+".outbox", "--broker", brokerURL)
		stdout, stderr, code := runCLI(t, nil, "verify", "--db", url, "--table", table.Schema+".outbox", "--broker", brokerURL,
			"--events", "40", "--deadline", "30s")
		if code != 0 || !strings.Contains(stdout, "delivered    40 of 40") {
			t.Fatalf("verify on Kafka (kfake): %d\n%s\n%s", code, stdout, stderr)
		}
	})
	t.Run("webhook", func(t *testing.T) {
		t.Parallel()
		table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
		addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		hook, secret := "http://"+addr+"/events", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		startRelayProc(t, nil, "--db", url, "--table", table.Schema+".outbox", "--broker", hook, "--webhook-secret", secret)
		stdout, stderr, code := runCLI(t, nil, "verify", "--db", url, "--table", table.Schema+".outbox", "--broker", hook,
			"--webhook-listen", addr, "--webhook-secret", secret, "--events", "30", "--deadline", "30s")
		if code != 0 || !strings.Contains(stdout, "delivered    30 of 30") {
			t.Fatalf("verify on a webhook: %d\n%s\n%s", code, stdout, stderr)
		}
		_, stderr, code = runCLI(t, nil, "verify", "--db", url, "--table", table.Schema+".outbox", "--broker", hook)
		if code != 2 || !strings.Contains(stderr, "--webhook-listen") {
			t.Fatalf("a webhook without a receiver: %d %s", code, stderr)
		}
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		redisURL := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
		table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
		tmpl := testenv.UniqueName("verify:") + "${aggregatetype}"
		startRelayProc(t, nil, "--db", url, "--table", table.Schema+".outbox", "--broker", redisURL, "--topic-template", tmpl)
		stdout, stderr, code := runCLI(t, nil, "verify", "--db", url, "--table", table.Schema+".outbox", "--broker", redisURL,
			"--topic-template", tmpl, "--events", "40", "--deadline", "30s")
		if code != 0 || !strings.Contains(stdout, "delivered    40 of 40") {
			t.Fatalf("verify on Redis: %d\n%s\n%s", code, stdout, stderr)
		}
	})
}

// TestAnalyzeVerify: duplicates and events that overtake an earlier event of their
// aggregate are reported; other aggregates interleaving is not disorder.
func TestAnalyzeVerify(t *testing.T) {
	now := time.Now()
	sent := []verifySent{{"a1", "a", now}, {"b1", "b", now}, {"a2", "a", now}, {"a3", "a", now}, {"b2", "b", now}}
	at := func(ids ...string) []verifyArrival {
		out := make([]verifyArrival, len(ids))
		for i, id := range ids {
			out[i] = verifyArrival{id: id, arrived: now.Add(time.Duration(i+1) * time.Millisecond)}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		got  []verifyArrival
		want string
	}{
		{"in order, aggregates interleaved", at("b1", "a1", "b2", "a2", "a3"), "5 of 5 delivered, 0 lost, 0 duplicated, 0 out of order"},
		{"a3 overtakes a2", at("a1", "b1", "a3", "a2", "b2"), "5 of 5 delivered, 0 lost, 0 duplicated, 1 out of order"},
		{"a duplicate and a loss", at("a1", "a1", "b1", "a2", "a3"), "4 of 5 delivered, 1 lost, 1 duplicated, 0 out of order"},
		{"strangers ignored", at("zz", "a1", "b1", "a2", "a3", "b2"), "5 of 5 delivered, 0 lost, 0 duplicated, 0 out of order"},
	} {
		r := analyzeVerify(sent, tc.got)
		if r.summary() != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, r.summary(), tc.want)
		}
		if r.ok() != strings.HasPrefix(tc.want, "5 of 5 delivered, 0 lost, 0 duplicated, 0 out") {
			t.Errorf("%s: ok() = %v", tc.name, r.ok())
		}
	}
}

// reversing is a broken publisher: it sends each batch in reverse order.
type reversing struct{ broker.Publisher }

func (p reversing) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	rev := slices.Clone(msgs)
	slices.Reverse(rev)
	res := p.Publisher.Publish(ctx, rev)
	slices.Reverse(res)
	return res
}

// TestVerifyOutOfOrder: against a relay whose publisher reorders, verify fails and
// says how many events arrived out of order.
func TestVerifyOutOfOrder(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ns := newNATSScope(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := natspub.Dial(ctx, ns.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	store, _ := outboxpgx.New(pool, &table).Store()
	// Batches of 10 reach the broker reversed: within a batch, later events of an
	// aggregate arrive before earlier ones.
	relaytest.Start(t, store, reversing{pub}, &relay.Config{TopicTemplate: ns.template(), BatchSize: 10})
	var stdout, stderr bytes.Buffer
	err = runVerify(ctx, []string{"--db", url, "--table", table.Schema + ".outbox", "--broker", ns.url,
		"--topic-template", ns.template(), "--events", "40", "--aggregates", "2", "--deadline", "20s"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "out of order") || strings.Contains(stdout.String(), "out of order 0\n") {
		t.Fatalf("verify of a reordering relay: %v\n%s", err, stdout.String())
	}
	if !strings.Contains(stdout.String(), "delivered    40 of 40") || !strings.Contains(stdout.String(), "FAILED") {
		t.Fatalf("report:\n%s", stdout.String())
	}
}
