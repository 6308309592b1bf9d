// Package webhook delivers outbox events as HTTP POSTs signed per the Standard
// Webhooks convention: headers webhook-id (the event id, the receiver's dedup key),
// webhook-timestamp (Unix seconds) and webhook-signature ("v1," + base64 of
// HMAC-SHA256 over "id.timestamp.body" with the shared secret). The body is the payload;
// the wire-format headers travel as HTTP headers, the key as Outbox-Key and the topic
// as Outbox-Topic.
//
// Messages of one key are posted one after another (the next only after a 2xx), keys
// in parallel. A 2xx acknowledges. A failure belongs to the request that met it: a
// 408, 429 or 5xx is a refusal of that event, retried on its own schedule (after the
// Retry-After the endpoint sent, if any) while other keys go on; only when most recent
// requests failed that way, or the endpoint cannot be reached at all, is the endpoint
// unavailable (no attempt spent, the relay backs off as a whole). A 3xx is not
// followed (a signed body is never re-sent elsewhere): the endpoint is taken as
// unavailable until the URL is fixed. Any other 4xx is a permanent refusal.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/internal/wire"
)

// Defaults.
const (
	TimeoutDefault     = 10 * time.Second
	ConcurrencyDefault = 16
)

// Header names.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	HeaderKey       = "Outbox-Key"
	HeaderTopic     = "Outbox-Topic"
)

// Config configures a Publisher.
type Config struct {
	// Secret signs the requests: "whsec_" followed by base64, as Standard Webhooks
	// secrets are written, or raw bytes without that prefix. Required.
	Secret string
	// Client sends the requests. Default: a client with Timeout.
	Client *http.Client
	// Timeout bounds each request when Client is nil. Default TimeoutDefault.
	Timeout time.Duration
	// Concurrency is how many keys are posted at once. Default ConcurrencyDefault.
	Concurrency int
	// MaxMessageBytes, if set, refuses larger payloads before sending them.
	MaxMessageBytes int
	// Now is the clock for timestamps (tests). Default time.Now.
	Now func() time.Time
}

// Publisher posts events. Build it with Dial.
type Publisher struct {
	cfg    Config
	url    string
	secret []byte
	health *window
}

// window remembers whether the last requests failed with a 408, 429, 5xx or a
// network error, to tell a flaky endpoint (a few requests refused: their events are
// retried) from a failing one (most refused: the whole publisher backs off).
type window struct {
	mu     sync.Mutex
	failed [windowSize]bool
	n, at  int
}

const (
	windowSize = 20
	windowMin  = 8 // requests seen before the endpoint can be judged down
)

// record adds one request's outcome and reports whether most recent requests failed.
func (w *window) record(failed bool) (mostFail bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failed[w.at] = failed
	w.at = (w.at + 1) % windowSize
	w.n = min(w.n+1, windowSize)
	bad := 0
	for i := 0; i < w.n; i++ {
		if w.failed[i] {
			bad++
		}
	}
	return w.n >= windowMin && 2*bad > w.n
}

// Dial validates url (http:// or https://, where every event is POSTed) and cfg
// and returns a publisher, as the other publishers' Dial do. HTTP has no session:
// nothing is sent until the first Publish, so an unreachable endpoint shows there.
func Dial(_ context.Context, url string, cfg *Config) (*Publisher, error) {
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("webhook: URL %q must be http:// or https://", redact.Endpoint(url))
	}
	if cfg == nil {
		return nil, errors.New("webhook: a Config with a signing secret is required")
	}
	c := *cfg
	cfg = &c
	secret, err := DecodeSecret(cfg.Secret)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = TimeoutDefault
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	// Never follow a redirect: a 302 would turn the POST into a GET without the body
	// (and count as delivered), a 307 would re-send the signed body wherever Location
	// says. The 3xx itself is the answer.
	client := *cfg.Client
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	cfg.Client = &client
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = ConcurrencyDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Publisher{cfg: c, url: url, secret: secret, health: &window{}}, nil
}

// DecodeSecret reads a "whsec_<base64>" secret, or takes any other string as raw bytes.
func DecodeSecret(s string) ([]byte, error) {
	if s == "" {
		return nil, errors.New("webhook: a signing secret is required")
	}
	if rest, ok := strings.CutPrefix(s, "whsec_"); ok {
		b, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, fmt.Errorf("webhook: secret after whsec_ is not base64: %w", err)
		}
		return b, nil
	}
	return []byte(s), nil
}

// Sign returns the webhook-signature value for a request.
func Sign(secret []byte, id string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%s.%d.", id, ts)
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Verify checks a request's signature, for receivers (and tests). It accepts any of
// the space-separated v1 signatures and a timestamp within tolerance of now.
func Verify(secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	ts, err := strconv.ParseInt(h.Get(HeaderTimestamp), 10, 64)
	if err != nil {
		return errors.New("webhook: bad timestamp")
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return errors.New("webhook: timestamp outside the tolerance")
	}
	want := Sign(secret, h.Get(HeaderID), ts, body)
	for _, sig := range strings.Fields(h.Get(HeaderSignature)) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return errors.New("webhook: no valid signature")
}

var _ broker.Publisher = (*Publisher)(nil)

// Publish implements broker.Publisher: the messages of one key one after another,
// each after the previous one's 2xx, Concurrency keys at once.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	reqs := make([]*http.Request, len(msgs))
	return broker.Sequence(ctx, msgs, broker.Schedule{Sequential: true, Concurrency: p.cfg.Concurrency}, broker.Sender{
		Prepare: func(ctx context.Context, i int) (err error) {
			reqs[i], err = p.request(ctx, &msgs[i])
			return err
		},
		Send: func(ctx context.Context, i int) (broker.Future, error) {
			resp, err := p.cfg.Client.Do(reqs[i])
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				p.health.record(true)
				return nil, broker.Unavailable(fmt.Errorf("webhook: %w", err))
			}
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			return broker.Answered{Err: p.classify(resp)}, nil
		},
	})
}

// request makes every check an endpoint or net/http would make, and builds the
// signed request: a refusal here is the event's, never taken for an unreachable
// endpoint.
func (p *Publisher) request(ctx context.Context, m *broker.Message) (*http.Request, error) {
	if p.cfg.MaxMessageBytes > 0 && len(m.Payload) > p.cfg.MaxMessageBytes {
		return nil, broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the limit of %d", len(m.Payload), p.cfg.MaxMessageBytes))
	}
	if err := broker.CheckHeaders(m); err != nil {
		return nil, err
	}
	for _, v := range []string{m.Key, m.Topic} {
		if problem := wire.HeaderValueProblem(v); problem != "" {
			return nil, broker.Permanent(fmt.Errorf("key or topic: %s", problem))
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(m.Payload))
	if err != nil {
		return nil, broker.Permanent(err)
	}
	ts := p.cfg.Now().Unix()
	ct := m.MediaType()
	m.EachHeader(func(k, v string) { req.Header.Set(k, v) })
	req.Header.Set("Content-Type", ct)
	req.Header.Set(HeaderID, m.ID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign(p.secret, m.ID, ts, m.Payload))
	req.Header.Set(HeaderKey, m.Key)
	req.Header.Set(HeaderTopic, m.Topic)
	return req, nil
}

// classify turns an answer into the event's outcome.
func (p *Publisher) classify(resp *http.Response) error {
	code := resp.StatusCode
	err := fmt.Errorf("webhook: endpoint answered %d %s", code, http.StatusText(code))
	switch {
	case code >= 200 && code < 300:
		p.health.record(false)
		return nil
	case code >= 300 && code < 400:
		loc := redact.URL(resp.Header.Get("Location"))
		return broker.Unavailable(fmt.Errorf("%w: a redirect to %q, which is not followed (configure the final URL)", err, loc))
	case code == http.StatusTooManyRequests, code == http.StatusRequestTimeout, code >= 500:
		if p.health.record(true) {
			return broker.Unavailable(fmt.Errorf("%w (most recent requests failed)", err))
		}
		if d := retryAfter(resp.Header.Get("Retry-After"), p.cfg.Now()); d > 0 {
			return broker.RetryAfter(err, d)
		}
		return err // this event is retried on its own schedule; it counts an attempt
	}
	p.health.record(false)
	return broker.Permanent(err)
}

// retryAfter reads a Retry-After value: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Features implements broker.Publisher. Dedup is the receiver's job (by webhook-id).
func (p *Publisher) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// Close implements broker.Publisher.
func (p *Publisher) Close() error {
	p.cfg.Client.CloseIdleConnections()
	return nil
}
