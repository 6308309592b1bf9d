package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/cloudevents"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "whsec_c2VjcmV0LWZvci10ZXN0cw==" // "secret-for-tests"

// receiver is a real HTTP endpoint on loopback that checks signatures and keeps what
// it accepted. It can be stopped and started again on the same address.
type receiver struct {
	t    *testing.T
	addr string
	srv  *http.Server
	done chan struct{}

	mu     sync.Mutex
	got    []broker.Message
	status int // forced status, 0 for normal behaviour
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{t: t, addr: "127.0.0.1:0"}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *receiver) start() {
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve)}
	r.done = make(chan struct{})
	go func() { defer close(r.done); _ = r.srv.Serve(ln) }()
}

func (r *receiver) stop() {
	_ = r.srv.Close()
	<-r.done
}

func (r *receiver) url() string { return "http://" + r.addr + "/hook" }

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.status != 0 {
		w.WriteHeader(r.status)
		return
	}
	key, _ := webhook.DecodeSecret(secret)
	if err := webhook.Verify(key, req.Header, body, time.Now(), 5*time.Minute); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if len(body) > 4096 {
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		return
	}
	h := map[string]string{}
	for k := range req.Header {
		h[k] = req.Header.Get(k)
	}
	// HTTP canonicalises header names; give the wire-format names back.
	for _, n := range []string{"id", "eventType", "aggregateType", "aggregateId", "correlationId"} {
		if v := req.Header.Get(n); v != "" {
			h[n] = v
		}
	}
	r.got = append(r.got, broker.Message{ID: req.Header.Get(webhook.HeaderID), Topic: req.Header.Get(webhook.HeaderTopic),
		Key: req.Header.Get(webhook.HeaderKey), Payload: body, Headers: h, ContentType: req.Header.Get("Content-Type")})
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) read(ctx context.Context, topic string, n int) ([]broker.Message, error) {
	for {
		r.mu.Lock()
		var got []broker.Message
		for _, m := range r.got {
			if m.Topic == topic {
				got = append(got, m)
			}
		}
		r.mu.Unlock()
		if len(got) >= n {
			return got[:n], nil
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("have %d of %d: %w", len(got), n, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		r := newReceiver(t)
		pub, err := webhook.Dial(context.Background(), r.url(), &webhook.Config{Secret: secret, MaxMessageBytes: 4096, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		return &brokertest.Harness{
			CloudEvents: cloudevents.HTTP,
			Publisher:   pub,
			Topic:       func(*testing.T) string { return brokertest.UniqueName("outbox.event.t") },
			Read:        r.read,
			Restart: func(*testing.T) {
				pub.Close() // drop kept-alive connections, as a server restart would
				r.stop()
				r.start()
			},
		}
	})
}

func TestStatusClasses(t *testing.T) {
	r := newReceiver(t)
	pub, err := webhook.Dial(context.Background(), r.url(), &webhook.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, tc := range []struct {
		status                 int
		unavailable, permanent bool
	}{
		// A 5xx or 429 refuses this event (retried on its own); the endpoint is
		// unavailable only when most requests fail (TestMostFail).
		{503, false, false}, {429, false, false}, {502, false, false},
		{500, false, false}, {408, false, false},
		// A redirect is not followed: the URL needs fixing, no event is at fault.
		{302, true, false}, {307, true, false},
		{400, false, true}, {401, false, true}, {404, false, true}, {413, false, true},
	} {
		r.mu.Lock()
		r.status = tc.status
		r.mu.Unlock()
		res := pub.Publish(context.Background(), []broker.Message{
			{ID: "a", Topic: "t", Key: "k", Payload: []byte("{}")},
			{ID: "b", Topic: "t", Key: "k", Payload: []byte("{}")},
		})
		err := res[0].Err
		if err == nil || broker.IsUnavailable(err) != tc.unavailable || broker.IsPermanent(err) != tc.permanent {
			t.Errorf("status %d: err = %v; want unavailable=%v permanent=%v", tc.status, err, tc.unavailable, tc.permanent)
		}
		if tc.unavailable != broker.IsUnavailable(res[1].Err) || (!tc.unavailable && !broker.IsHeldBack(res[1].Err)) {
			t.Errorf("status %d: the key's next message: %v", tc.status, res[1].Err)
		}
	}
	// The endpoint is gone: unavailable.
	r.stop()
	res := pub.Publish(context.Background(), []broker.Message{{ID: "c", Topic: "t", Key: "k", Payload: []byte("{}")}})
	if !broker.IsUnavailable(res[0].Err) {
		t.Errorf("closed endpoint: %v", res[0].Err)
	}
	r.start()
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		url string
		cfg *webhook.Config
	}{
		{"ftp://x", &webhook.Config{Secret: "s"}},
		{"http://127.0.0.1:1/x", &webhook.Config{}},
		{"http://127.0.0.1:1/x", nil},
		{"http://127.0.0.1:1/x", &webhook.Config{Secret: "whsec_%%%"}},
	} {
		if _, err := webhook.Dial(context.Background(), tc.url, tc.cfg); err == nil {
			t.Errorf("%s %+v accepted", tc.url, tc.cfg)
		}
	}
}

// TestSignatureVector checks Sign against the Standard Webhooks reference example.
func TestSignatureVector(t *testing.T) {
	key, _ := webhook.DecodeSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	got := webhook.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
}

// TestMostFail: a few 5xx answers are the events' own refusals; when most recent
// requests fail, the endpoint is down and the publisher says so (no attempt spent).
func TestMostFail(t *testing.T) {
	r := newReceiver(t)
	pub, err := webhook.Dial(context.Background(), r.url(), &webhook.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r.mu.Lock()
	r.status = 503
	r.mu.Unlock()
	var last error
	for i := range 12 {
		res := pub.Publish(context.Background(), []broker.Message{{ID: fmt.Sprint(i), Topic: "t", Key: "k", Payload: []byte("{}")}})
		last = res[0].Err
		if i < 7 && broker.IsUnavailable(last) {
			t.Fatalf("request %d: unavailable after %d failures: %v", i, i+1, last)
		}
	}
	if !broker.IsUnavailable(last) {
		t.Fatalf("after 12 failures in a row: %v, want unavailable", last)
	}
}

func TestRetryAfter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	pub, err := webhook.Dial(context.Background(), srv.URL, &webhook.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	res := pub.Publish(context.Background(), []broker.Message{{ID: "a", Topic: "t", Key: "k", Payload: []byte("{}")}})
	if d := broker.RetryAfterOf(res[0].Err); d != 7*time.Second || broker.IsUnavailable(res[0].Err) {
		t.Fatalf("429 with Retry-After 7: %v (after %v)", res[0].Err, d)
	}
}

// TestUnsendableHeader: an event whose header net/http cannot send (a newline in the
// aggregate id, a space in a header name) is refused permanently, never taken for an
// unreachable endpoint; other keys are delivered.
func TestUnsendableHeader(t *testing.T) {
	r := newReceiver(t)
	pub, err := webhook.Dial(context.Background(), r.url(), &webhook.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	res := pub.Publish(context.Background(), []broker.Message{
		{ID: "a", Topic: "t", Key: "k\n1", AggregateID: "k\n1", Payload: []byte("{}")},
		{ID: "b", Topic: "t", Key: "k2", Payload: []byte("{}"), Headers: map[string]string{"bad name": "x"}},
		{ID: "c", Topic: "t", Key: "k3", Payload: []byte("{}")},
	})
	for i := range 2 {
		if !broker.IsPermanent(res[i].Err) {
			t.Errorf("message %d: %v, want a permanent refusal", i, res[i].Err)
		}
	}
	if res[2].Err != nil {
		t.Errorf("healthy message: %v", res[2].Err)
	}
}
