package foreign

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	amqppub "github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	mqttpub "github.com/outboxd/outbox/broker/mqtt"
	natspub "github.com/outboxd/outbox/broker/nats"
	redispub "github.com/outboxd/outbox/broker/redis"
	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// node is Node.js with this package's npm dependencies installed (npm ci in node/).
func node(t *testing.T) string {
	t.Helper()
	n, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join("node", "node_modules", "kafkajs"))
	}
	if err != nil {
		testenv.Missing(t, "node with the foreign clients (cd internal/foreign/node && npm ci): %v", err)
	}
	return n
}

// record is what a foreign client printed of one message.
type record struct {
	Key     string            `json:"key"`
	Headers map[string]string `json:"headers"`
	Value   string            `json:"value"`
}

// relayEvents writes events over three aggregates and relays them with pub until
// every one is published; it returns them in write order.
func relayEvents(t *testing.T, pub broker.Publisher, n int) []outbox.Event {
	t.Helper()
	return relayTo(t, pub, "", n)
}

// relayTo is relayEvents with a topic template ("" for the default).
func relayTo(t *testing.T, pub broker.Publisher, template string, n int) []outbox.Event {
	t.Helper()
	_, drv := testenv.Outbox(t)
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint("agg-", i%3), Type: "OrderPlaced",
			Payload: []byte(fmt.Sprintf(`{"i":%d,"note":"héllo"}`, i)), Headers: map[string]string{"correlationId": fmt.Sprint("c-", i)}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.Write(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	r := relaytest.Start(t, store, pub, &relay.Config{BatchSize: 7, TopicTemplate: template})
	testenv.Wait(t, ctx, "every event published", func() bool { return r.Stats().Published >= int64(n) })
	return evs
}

// check compares what a foreign client read with what was written: each event
// once, its id, key, headers and payload, in write order per aggregate.
func check(t *testing.T, evs []outbox.Event, out []byte) {
	t.Helper()
	var got []record
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("not a record line %q: %v", sc.Text(), err)
		}
		got = append(got, r)
	}
	if len(got) != len(evs) {
		t.Fatalf("read %d messages, want %d:\n%s", len(got), len(evs), out)
	}
	byID := map[string]outbox.Event{}
	for _, e := range evs {
		byID[e.ID] = e
	}
	last := map[string]int{}
	pos := map[string]int{}
	for i, e := range evs {
		pos[e.ID] = i
	}
	for _, r := range got {
		e, ok := byID[r.Headers["id"]]
		if !ok {
			t.Fatalf("a message with id %q, which no event has: %+v", r.Headers["id"], r)
		}
		// The default jsonb column stores JSON normalised (the README says so): the
		// payload arrives JSON-equal, not byte-equal.
		if r.Key != e.AggregateID || !jsonEqual(r.Value, e.Payload) || r.Headers["eventType"] != e.Type ||
			r.Headers["aggregateType"] != e.AggregateType || r.Headers["correlationId"] != e.Headers["correlationId"] {
			t.Fatalf("message %+v does not carry event %+v as documented", r, e)
		}
		if p, seen := last[r.Key]; seen && pos[e.ID] < p {
			t.Fatalf("aggregate %s: event %d read after %d", r.Key, pos[e.ID], p)
		}
		last[r.Key] = pos[e.ID]
	}
}

// TestKafkaJS: kafkajs, with no codec plugin, reads the relay's records from kfake (no
// Kafka broker runs here): uncompressed by default, key = aggregate id, the
// wire-format headers and the event's own, the payload's bytes.
func TestKafkaJS(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	const topic, n = "outbox.event.order", 30
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	pub, err := kafka.Dial(context.Background(), "kafka://"+strings.Join(cluster.ListenAddrs(), ","), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	evs := relayEvents(t, pub, n)
	readAndCheck(t, evs, "kafkajs", nodeBin, "node/kafka.js", cluster.ListenAddrs()[0], topic, fmt.Sprint(n))
}

// TestNatsJS: nats.js reads the relay's messages from a JetStream stream (an embedded
// server): Nats-Msg-Id = event id, the key in Outbox-Key, the headers, the payload.
func TestNatsJS(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	ns, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	const n = 30
	pub, err := natspub.Dial(context.Background(), ns.URL(), &natspub.Config{CreateStream: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	evs := relayEvents(t, pub, n)
	readAndCheck(t, evs, "nats.js", nodeBin, "node/nats.js", ns.URL(), "OUTBOX", fmt.Sprint(n))
}

func jsonEqual(got string, want []byte) bool {
	var a, b any
	return json.Unmarshal([]byte(got), &a) == nil && json.Unmarshal(want, &b) == nil && fmt.Sprint(a) == fmt.Sprint(b)
}

// readAndCheck runs a foreign client that reads what the relay published, and
// checks its output against the events written.
func readAndCheck(t *testing.T, evs []outbox.Event, name, nodeBin string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, nodeBin, args...).Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, stderrOf(err))
	}
	check(t, evs, out)
}

func stderrOf(err error) string {
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

// readyConsumer starts a foreign consumer that says "ready" on stderr once it is
// subscribed, and waits for that.
func readyConsumer(t *testing.T, ctx context.Context, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.CommandContext(ctx, node(t), args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var said strings.Builder
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- ""
				_, _ = io.Copy(io.Discard, stderr)
				return
			}
			said.WriteString(sc.Text() + "\n")
		}
		ready <- said.String()
	}()
	if said := <-ready; said != "" {
		_ = cmd.Wait()
		t.Fatalf("%s did not subscribe:\n%s", args[0], said)
	}
	return cmd, &out
}

// TestIORedis: ioredis reads the relay's stream entries: the key, type, headers and
// payload fields as documented.
func TestIORedis(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	url := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
	pub, err := redispub.Dial(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	prefix := testenv.UniqueName("foreign")
	const n = 30
	evs := relayTo(t, pub, prefix+".${aggregatetype}", n)
	readAndCheck(t, evs, "ioredis", nodeBin, "node/redis.js", url, prefix+".order", fmt.Sprint(n))
}

// TestAMQPLib: amqplib, bound to the relay's exchange, reads its messages: message_id
// and the id header, type, the key in outbox-key, the headers, the body.
func TestAMQPLib(t *testing.T) {
	t.Parallel()
	url := testenv.ServiceURL(t, "TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "127.0.0.1:5672", "RabbitMQ")
	exchange := testenv.UniqueName("foreign")
	pub, err := amqppub.Dial(context.Background(), url, &amqppub.Config{Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 30
	cmd, out := readyConsumer(t, ctx, "node/amqp.js", url, exchange, "outbox.event.#", fmt.Sprint(n))
	evs := relayEvents(t, pub, n)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("amqplib: %v\n%s", err, out)
	}
	check(t, evs, out.Bytes())
}

// TestMQTTJS: MQTT.js, subscribed at QoS 1, reads the relay's messages: the key in
// the outbox-key user property, the headers as user properties, the payload.
func TestMQTTJS(t *testing.T) {
	t.Parallel()
	url := testenv.ServiceURL(t, "TEST_MQTT_URL", "mqtt://127.0.0.1:1883", "127.0.0.1:1883", "Mosquitto")
	pub, err := mqttpub.Dial(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	prefix := testenv.UniqueName("foreign")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 30
	cmd, out := readyConsumer(t, ctx, "node/mqtt.js", url, prefix+"/#", fmt.Sprint(n))
	evs := relayTo(t, pub, prefix+"/${aggregatetype}", n)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("MQTT.js: %v\n%s", err, out)
	}
	check(t, evs, out.Bytes())
}
