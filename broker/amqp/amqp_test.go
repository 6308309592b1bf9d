package amqp_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func amqpURL(t *testing.T) string {
	t.Helper()
	return testenv.ServiceURL(t, "TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "127.0.0.1:5672", "RabbitMQ")
}

// sink is a queue bound to everything on an exchange, and what was read from it.
type sink struct {
	url, queue string
	mu         sync.Mutex
	got        []broker.Message
}

func newSink(t *testing.T, url, exchange string) *sink {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare(exchange+".sink", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, _ := conn.Channel()
		_, _ = ch.QueueDelete(q.Name, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	return &sink{url: url, queue: q.Name}
}

func (s *sink) read(ctx context.Context, topic string, n int) ([]broker.Message, error) {
	conn, err := amqp091.Dial(s.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	for {
		d, ok, err := ch.Get(s.queue, true)
		if err != nil {
			return nil, err
		}
		if ok {
			h := map[string]string{}
			for k, v := range d.Headers {
				h[k] = fmt.Sprint(v)
			}
			s.mu.Lock()
			s.got = append(s.got, broker.Message{ID: d.MessageId, Topic: d.RoutingKey, Key: h[amqp.HeaderKey], Payload: d.Body, Headers: h, ContentType: d.ContentType})
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		var out []broker.Message
		for _, m := range s.got {
			if m.Topic == topic {
				out = append(out, m)
			}
		}
		s.mu.Unlock()
		if len(out) >= n {
			return out[:n], nil
		}
		select {
		case <-ctx.Done():
			return out, fmt.Errorf("have %d of %d: %w", len(out), n, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// closeConnections makes RabbitMQ drop the publisher's connections, as a broker
// restart would.
func closeConnections(t *testing.T, name string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "pid", "client_properties").Output()
	if err != nil {
		testenv.Missing(t, "rabbitmqctl: %v", err)
	}
	closed := 0
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, name) {
			continue
		}
		conn := strings.Split(line, "\t")[0]
		if err := exec.Command("rabbitmqctl", "-q", "close_connection", conn, "test restart").Run(); err == nil {
			closed++
		}
	}
	if closed == 0 {
		t.Fatalf("found no connection named %s to close in:\n%s", name, out)
	}
}

func TestConformance(t *testing.T) {
	url := amqpURL(t)
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		exchange := testenv.UniqueName("outboxtest.")
		s := newSink(t, url, exchange)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		name := testenv.UniqueName("outbox-test-")
		pub, err := amqp.Dial(ctx, url, &amqp.Config{Exchange: exchange, MaxMessageBytes: 4096, ConnectionName: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		return &brokertest.Harness{
			CloudEvents: cloudevents.AMQP,
			Publisher:   pub,
			Topic:       func(*testing.T) string { return testenv.UniqueName("outbox.event.t") },
			Read:        s.read,
			Restart: func(t *testing.T) {
				t.Helper()
				closeConnections(t, name)
			},
		}
	})
}

func TestUnroutable(t *testing.T) {
	url := amqpURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	exchange := testenv.UniqueName("outboxtest.")
	pub, err := amqp.Dial(ctx, url, &amqp.Config{Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	defer func() {
		conn, _ := amqp091.Dial(url)
		ch, _ := conn.Channel()
		_ = ch.ExchangeDelete(exchange, false, false)
		conn.Close()
	}()
	res := pub.Publish(ctx, []broker.Message{{ID: "a", Topic: "nobody.listens", Key: "k", Payload: []byte("{}")}})
	// The topic's failure, not the connection's: retried on the message's own
	// schedule while other topics go on.
	if !errors.Is(res[0].Err, amqp.ErrUnroutable) || broker.IsUnavailable(res[0].Err) || broker.IsPermanent(res[0].Err) {
		t.Fatalf("unroutable message: %v", res[0].Err)
	}
}

func TestBadURL(t *testing.T) {
	ctx := context.Background()
	if _, err := amqp.Dial(ctx, "http://x", nil); err == nil {
		t.Fatal("http URL accepted")
	}
	_, err := amqp.Dial(ctx, "amqp://u:hunter2@127.0.0.1:1/", &amqp.Config{DialTimeout: time.Second})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("closed port: %v", err)
	}
}
