package mqtt_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/mqtt"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// subscriber keeps a subscription to prefix/# open, reconnecting after the broker
// restarts, and keeps what it received.
type subscriber struct {
	addr, filter string
	mu           sync.Mutex
	got          []broker.Message
	ready        chan struct{}
	stop         chan struct{}
	done         chan struct{}
}

func subscribe(t *testing.T, addr, filter string) *subscriber {
	t.Helper()
	s := &subscriber{addr: addr, filter: filter, ready: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	t.Cleanup(func() { close(s.stop); <-s.done })
	s.waitReady(t)
	return s
}

func (s *subscriber) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-s.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber did not connect")
	}
}

// pause waits a moment before the next connection attempt, and reports whether the
// subscriber was stopped meanwhile.
func (s *subscriber) pause() (stopped bool) {
	select {
	case <-s.stop:
		return true
	case <-time.After(20 * time.Millisecond):
		return false
	}
}

func (s *subscriber) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		conn, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err != nil {
			if s.pause() {
				return
			}
			continue
		}
		c := paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				h := map[string]string{}
				var ct string
				if pr.Packet.Properties != nil {
					for _, u := range pr.Packet.Properties.User {
						h[u.Key] = u.Value
					}
					ct = pr.Packet.Properties.ContentType
				}
				s.mu.Lock()
				s.got = append(s.got, broker.Message{ID: h["id"], Topic: pr.Packet.Topic, Key: h[mqtt.HeaderKey], Payload: pr.Packet.Payload, Headers: h, ContentType: ct})
				s.mu.Unlock()
				return true, nil
			}}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = c.Connect(ctx, &paho.Connect{ClientID: testenv.UniqueName("sub-"), CleanStart: true, KeepAlive: 5})
		if err == nil {
			_, err = c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: s.filter, QoS: 1}}})
		}
		cancel()
		if err != nil {
			_ = conn.Close()
			if s.pause() {
				return
			}
			continue
		}
		select {
		case s.ready <- struct{}{}:
		default:
		}
		select {
		case <-s.stop:
			_ = c.Disconnect(&paho.Disconnect{})
			<-c.Done()
			return
		case <-c.Done():
		}
	}
}

func (s *subscriber) read(ctx context.Context, topic string, n int) ([]broker.Message, error) {
	for {
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
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func harness(t *testing.T, addr string, restart func(*testing.T, *subscriber)) *brokertest.Harness {
	t.Helper()
	return harnessWithID(t, addr, "", restart)
}

func harnessWithID(t *testing.T, addr, clientID string, restart func(*testing.T, *subscriber)) *brokertest.Harness {
	t.Helper()
	prefix := testenv.UniqueName("outboxtest")
	s := subscribe(t, addr, prefix+"/#")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := mqtt.Dial(ctx, "mqtt://"+addr, &mqtt.Config{MaxMessageBytes: 4096, Timeout: 2 * time.Second, ClientID: clientID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	h := &brokertest.Harness{
		CloudEvents: cloudevents.MQTT,
		Publisher:   pub,
		Topic:       func(*testing.T) string { return testenv.UniqueName(prefix + "/t") },
		Read:        s.read,
	}
	if restart != nil {
		h.Restart = func(t *testing.T) {
			t.Helper()
			restart(t, s)
		}
	}
	return h
}

func TestConformanceMachine(t *testing.T) {
	testenv.ServiceURL(t, "TEST_MQTT_URL", "mqtt://127.0.0.1:1883", "127.0.0.1:1883", "Mosquitto")
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		return harness(t, "127.0.0.1:1883", nil)
	})
}

// TestConformanceSessionTakenOver: the broker closes the publisher's connection for
// good when a second client connects with its client id (MQTT 5: "session taken
// over"); the publisher dials again and publishes on.
func TestConformanceSessionTakenOver(t *testing.T) {
	testenv.ServiceURL(t, "TEST_MQTT_URL", "mqtt://127.0.0.1:1883", "127.0.0.1:1883", "Mosquitto")
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		id := testenv.UniqueName("outbox-relay-")
		return harnessWithID(t, "127.0.0.1:1883", id, func(t *testing.T, _ *subscriber) {
			t.Helper()
			conn, err := net.DialTimeout("tcp", "127.0.0.1:1883", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			c := paho.NewClient(paho.ClientConfig{Conn: conn})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true}); err != nil {
				t.Fatal(err)
			}
			_ = c.Disconnect(&paho.Disconnect{})
			<-c.Done()
		})
	})
}

// TestConformanceRestart runs a mosquitto of its own, which it stops and starts again.
func TestConformanceRestart(t *testing.T) {
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = "/usr/sbin/mosquitto"
	}
	port := strconv.Itoa(testenv.FreePort(t))
	addr := "127.0.0.1:" + port
	var cmd *exec.Cmd
	start := func(t *testing.T) {
		t.Helper()
		cmd = exec.Command(bin, "-p", port)
		if err := cmd.Start(); err != nil {
			testenv.Missing(t, "mosquitto: %v", err)
		}
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		testenv.Wait(t, wctx, "mosquitto listening", func() bool {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	start(t)
	t.Cleanup(stop)
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		return harness(t, addr, func(t *testing.T, s *subscriber) {
			t.Helper()
			stop()
			start(t)
			s.waitReady(t) // the subscriber is back before anything is published
		})
	})
}

func TestEscapeToken(t *testing.T) {
	for in, want := range map[string]string{"order": "order", "a/b": "a%2Fb", "+": "%2B", "#": "%23", "": "_", "x%": "x%25"} {
		if got := mqtt.EscapeToken(in); got != want {
			t.Errorf("EscapeToken(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBadURL(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{"http://x", "mqtt://", "::"} {
		if _, err := mqtt.Dial(ctx, u, nil); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if _, err := mqtt.Dial(ctx, "mqtt://127.0.0.1:1", &mqtt.Config{Timeout: time.Second}); !broker.IsUnavailable(err) {
		t.Errorf("closed port: %v", err)
	}
}
