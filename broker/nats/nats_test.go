package nats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness publishes into a stream of its own on the server at url.
func harness(t *testing.T, url string, restart func(t *testing.T)) *brokertest.Harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := testenv.UniqueName("bt")
	pub, err := nats.Dial(ctx, url, &nats.Config{CreateStream: true, StreamName: prefix, StreamSubjects: []string{prefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	nc, err := natsgo.Connect(url, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, prefix)
	})
	return &brokertest.Harness{
		CloudEvents: cloudevents.NATS,
		Publisher:   pub,
		Topic:       func(*testing.T) string { return testenv.UniqueName(prefix + ".t") },
		Read: func(ctx context.Context, topic string, n int) ([]broker.Message, error) {
			return natstest.Read(ctx, url, prefix, topic, n)
		},
		Restart: restart,
	}
}

// TestConformanceMachine runs the suite against the machine's NATS server.
func TestConformanceMachine(t *testing.T) {
	url := natstest.URL(t)
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		return harness(t, url, nil)
	})
}

// TestConformanceEmbedded runs it against an in-process server, which it can restart.
func TestConformanceEmbedded(t *testing.T) {
	srv, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := natstest.KeepStreamsDir(kctx, srv.URL()); err != nil {
		t.Fatal(err)
	}
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		return harness(t, srv.URL(), func(t *testing.T) {
			t.Helper()
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// TestStreamsDirKept: tests across the packages create and delete file streams on the
// machine's one server at once. Once natstest.URL has run, none of those creations
// fails for the server removing its streams folder (natstest.KeepStreamsDir; two
// writers creating and deleting their own streams hit that in about one creation of
// sixteen without the kept stream, on the 2.9 server).
func TestStreamsDirKept(t *testing.T) {
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := testenv.UniqueName("kept")
	errs := make(chan error, 2)
	for w := range 2 {
		go func() {
			nc, err := natsgo.Connect(url)
			if err != nil {
				errs <- err
				return
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			for i := range 300 {
				name := fmt.Sprintf("%s_%d_%d", prefix, w, i)
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
					errs <- fmt.Errorf("stream %d of writer %d: %w", i, w, err)
					return
				}
				if err := js.DeleteStream(ctx, name); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 { // both writers end before the test does: none leaves a stream behind
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestNoStream(t *testing.T) {
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := nats.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// A subject no stream covers is that subject's problem (deferred: it waits on its
	// own schedule, never dead), not the connection's: a covered subject in the same
	// batch is published.
	covered := testenv.UniqueName("covered")
	natstest.Stream(t, url, covered)
	res := pub.Publish(ctx, []broker.Message{
		{ID: "a", Topic: testenv.UniqueName("nostream."), Key: "k", Payload: []byte("{}")},
		{ID: "b", Topic: covered + ".x", Key: "k2", Payload: []byte("{}")},
	})
	if !errors.Is(res[0].Err, nats.ErrNoStream) || !broker.IsDeferred(res[0].Err) || broker.IsUnavailable(res[0].Err) {
		t.Fatalf("err = %v, want ErrNoStream classed deferred", res[0].Err)
	}
	if res[1].Err != nil {
		t.Fatalf("covered subject in the same batch: %v", res[1].Err)
	}
}

// TestCreateStreamLeavesExistingStream: --nats-create-stream never rewrites a stream
// of that name that does not cover the subject (its subjects and limits are someone's
// configuration).
func TestCreateStreamLeavesExistingStream(t *testing.T) {
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := testenv.UniqueName("EXISTING")
	js, _ := natstest.CreateStream(t, url, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".own.>"}, MaxAge: time.Hour})
	pub, err := nats.Dial(ctx, url, &nats.Config{CreateStream: true, StreamName: name, StreamSubjects: []string{name + ".other.>"}})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	res := pub.Publish(ctx, []broker.Message{{ID: "a", Topic: name + ".other.x", Key: "k", Payload: []byte("{}")}})
	if !errors.Is(res[0].Err, nats.ErrNoStream) {
		t.Fatalf("publish to a subject the existing stream does not cover: %v", res[0].Err)
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; len(cfg.Subjects) != 1 || cfg.Subjects[0] != name+".own.>" || cfg.MaxAge != time.Hour {
		t.Fatalf("the existing stream was changed: subjects %v, max_age %v", cfg.Subjects, cfg.MaxAge)
	}
}

func TestDialErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := nats.Dial(ctx, "nats://user:secret@127.0.0.1:1", nil)
	if err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	if got := err.Error(); strings.Contains(got, "secret") {
		t.Fatalf("error leaks the password: %s", got)
	}
}

func TestEscapeToken(t *testing.T) {
	for in, want := range map[string]string{
		"order":       "order",
		"a.b":         "a%2Eb",
		"*":           "%2A",
		">":           "%3E",
		"x y\t":       "x%20y%09",
		"":            "_",
		"100%":        "100%25",
		"Überweisung": "Überweisung",
	} {
		if got := nats.EscapeToken(in); got != want {
			t.Errorf("EscapeToken(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStreamMaxMsgSize: a payload over the stream's max_msg_size is refused
// permanently before it is sent, and the key's later message is held back.
func TestStreamMaxMsgSize(t *testing.T) {
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := testenv.UniqueName("maxsize")
	natstest.CreateStream(t, url, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, MaxMsgSize: 100})
	pub, err := nats.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	topic := prefix + ".order"
	res := pub.Publish(ctx, []broker.Message{
		{ID: "a1", Topic: topic, Key: "a", Payload: []byte(strings.Repeat("x", 101))},
		{ID: "b1", Topic: topic, Key: "b", Payload: []byte("{}")},
		{ID: "a2", Topic: topic, Key: "a", Payload: []byte("{}")},
	})
	if !broker.IsPermanent(res[0].Err) || res[1].Err != nil || !broker.IsHeldBack(res[2].Err) {
		t.Fatalf("results = %v, %v, %v; want permanent, ok, held back", res[0].Err, res[1].Err, res[2].Err)
	}
}

// TestAckTimeoutOnCallersClient: a JetStream client the caller built may have no
// publish timeout of its own; an acknowledgement that never comes (a cut network, a
// paused server) must still end the wait after AckTimeout, as the connection's
// failure, never hang the relay's batch until its context ends.
func TestAckTimeoutOnCallersClient(t *testing.T) {
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	nc, err := natsgo.Connect("nats://"+proxy.Addr(), natsgo.PingInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc) // no WithPublishAsyncTimeout: the caller's choice
	prefix := testenv.UniqueName("acktimeout")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		admin, err := natsgo.Connect(url)
		if err == nil {
			ajs, _ := jetstream.New(admin)
			_ = ajs.DeleteStream(context.Background(), prefix)
			admin.Close()
		}
	}()
	pub, err := nats.New(js, &nats.Config{AckTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	topic := prefix + ".order"
	msg := func(id string) broker.Message {
		return broker.Message{ID: id, Topic: topic, Key: "k", Payload: []byte("{}")}
	}
	if res := pub.Publish(ctx, []broker.Message{msg("1")}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	proxy.Blackhole()
	start := time.Now()
	res := pub.Publish(ctx, []broker.Message{msg("2"), msg("3")})
	took := time.Since(start)
	for i, r := range res {
		if !broker.IsUnavailable(r.Err) {
			t.Errorf("message %d: err = %v, want the connection's failure (unavailable)", i, r.Err)
		}
	}
	if took > 5*time.Second {
		t.Errorf("publish took %v with AckTimeout 500ms", took)
	}
	proxy.Heal()
}

// TestStreamMaxMsgSizeRaised: the publisher caches a stream's limit, but an
// operator who raises it (to replay the dead letters it made) is heard at once.
func TestStreamMaxMsgSizeRaised(t *testing.T) {
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := testenv.UniqueName("raised")
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cfg := jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, MaxMsgSize: 100, Storage: jetstream.MemoryStorage}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), prefix)
	pub, err := nats.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	big := []broker.Message{{ID: "big", Topic: prefix + ".order", Key: "a", Payload: []byte(strings.Repeat("x", 101))}}
	if res := pub.Publish(ctx, big); !broker.IsPermanent(res[0].Err) {
		t.Fatalf("over the limit: %v, want permanent", res[0].Err)
	}
	cfg.MaxMsgSize = 1000
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if res := pub.Publish(ctx, big); res[0].Err != nil {
		t.Fatalf("after the limit was raised: %v", res[0].Err)
	}
}

// closeCase publishes, on the machine's NATS server, a batch of good messages with one
// whose subject is longer than the server's max_control_line, then another batch.
func closeCase(t *testing.T, maxControlLine int) (first, second []broker.Result) {
	t.Helper()
	url := natstest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prefix := testenv.UniqueName("close")
	pub, err := nats.Dial(ctx, url, &nats.Config{CreateStream: true, StreamName: prefix, StreamSubjects: []string{prefix + ".>"},
		MaxControlLine: maxControlLine})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	defer func() {
		nc, err := natsgo.Connect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		_ = js.DeleteStream(context.Background(), prefix)
	}()
	msg := func(topic, key string) broker.Message {
		return broker.Message{ID: testenv.UniqueName("id"), Topic: topic, Key: key, Payload: []byte(`{}`)}
	}
	long := prefix + "." + strings.Repeat("x", 5000)
	first = pub.Publish(ctx, []broker.Message{msg(prefix+".a", "a"), msg(long, "long"), msg(prefix+".b", "b")})
	// The relay retries what failed as unavailable; the next batch must go out once
	// the broker answers, whatever became of the connection.
	testenv.Wait(t, ctx, "the broker answering again", func() bool {
		second = pub.Publish(ctx, []broker.Message{msg(prefix+".a", "a"), msg(prefix+".b", "b")})
		return !broker.IsUnavailable(second[0].Err)
	})
	return first, second
}

// TestSubjectTooLongForTheServer: a subject that would make the server close the
// connection (its protocol line over max_control_line, from a very long aggregate
// type) is that message's permanent failure, found before sending; the others of
// the batch are published and the connection stays up. (It used to close the
// connection, and every later publish failed with "nats: connection closed".)
func TestSubjectTooLongForTheServer(t *testing.T) {
	first, second := closeCase(t, 0)
	if first[0].Err != nil || first[2].Err != nil || !broker.IsPermanent(first[1].Err) || !strings.Contains(first[1].Err.Error(), "max_control_line") {
		t.Fatalf("the batch with a too-long subject: %v", first)
	}
	if second[0].Err != nil || second[1].Err != nil {
		t.Fatalf("the next batch: %v", second)
	}
}

// TestConnectionClosedForGoodIsDialedAgain: when the server closes the connection for
// good (here a protocol error: a control line over its limit, sent because the check
// was told the server takes more), the publisher dials again and the next batch is
// published: "unavailable" ends once the broker answers.
func TestConnectionClosedForGoodIsDialedAgain(t *testing.T) {
	first, second := closeCase(t, 1<<20)
	if first[0].Err != nil {
		t.Fatalf("the message before the bad one: %v", first[0].Err)
	}
	if first[1].Err == nil {
		t.Fatal("the server took a control line over its limit")
	}
	if second[0].Err != nil || second[1].Err != nil {
		t.Fatalf("after the server closed the connection: %v", second)
	}
}
