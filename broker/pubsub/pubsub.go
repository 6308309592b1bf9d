// Package pubsub publishes to Google Cloud Pub/Sub with message ordering: each
// message's ordering key is its key (the aggregate id), so a subscription with
// ordering enabled delivers an aggregate's events in write order. Headers travel as
// attributes. Pub/Sub drops no duplicate on publish: consumers dedup by the id
// attribute (the inbox does).
//
// A key whose publish failed is paused by the client (later messages of the key fail
// at once, never overtaking it); the publisher reports them held back and resumes
// the key, so the relay's retry of the batch goes through in order. The client sends
// a key's messages in bundles and a bundle fails as a whole: the key's first message
// in the batch is charged with the failure, the rest are held back.
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"unicode/utf8"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxd/outbox/broker"
)

// MaxMessageBytesDefault is Pub/Sub's limit on a message (10 MB).
const MaxMessageBytesDefault = 10_000_000

// Config configures a Publisher.
type Config struct {
	// MaxMessageBytes refuses larger messages before they are sent. Default
	// MaxMessageBytesDefault.
	MaxMessageBytes int
	// CreateTopics creates a topic that does not exist (tests, the emulator); in
	// production topics are made by their owners, and a missing one defers its events.
	CreateTopics bool
}

// Publisher publishes to Pub/Sub. Build it with New or Dial.
type Publisher struct {
	c   *gpubsub.Client
	cfg Config
	own bool

	mu     sync.Mutex
	topics map[string]*gpubsub.Publisher
}

var (
	_ broker.Publisher      = (*Publisher)(nil)
	_ broker.TopicValidator = (*Publisher)(nil)
)

// New returns a publisher on a client the caller built (and closes).
func New(c *gpubsub.Client, cfg *Config) (*Publisher, error) {
	if c == nil {
		return nil, errors.New("pubsub publisher: client is nil")
	}
	p := &Publisher{c: c, topics: map[string]*gpubsub.Publisher{}}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.MaxMessageBytes <= 0 {
		p.cfg.MaxMessageBytes = MaxMessageBytesDefault
	}
	return p, nil
}

// Dial builds a client for pubsub://PROJECT (credentials as the Google client
// libraries find them; PUBSUB_EMULATOR_HOST points it at an emulator) and returns a
// publisher that owns it. opts are added to the client's (tests pass a connection).
func Dial(ctx context.Context, rawURL string, cfg *Config, opts ...option.ClientOption) (*Publisher, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "pubsub" || u.Host == "" {
		return nil, fmt.Errorf("Pub/Sub URL %q: want pubsub://PROJECT", rawURL)
	}
	c, err := gpubsub.NewClient(ctx, u.Host, opts...)
	if err != nil {
		return nil, broker.Unavailable(fmt.Errorf("connect to Pub/Sub (project %s): %w", u.Host, err))
	}
	p, _ := New(c, cfg)
	p.own = true
	return p, nil
}

// ValidateTopic implements broker.TopicValidator: a Pub/Sub topic id is 3 to 255
// characters, letters, digits and - _ . ~ + %, starting with a letter, not "goog".
func (p *Publisher) ValidateTopic(topic string) error { return ValidateTopic(topic) }

// ValidateTopic is the method without a publisher.
func ValidateTopic(topic string) error {
	if len(topic) < 3 || len(topic) > 255 {
		return fmt.Errorf("invalid Pub/Sub topic %q: 3 to 255 characters", topic)
	}
	if c := topic[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') || strings.HasPrefix(strings.ToLower(topic), "goog") {
		return fmt.Errorf("invalid Pub/Sub topic %q: it must start with a letter, and not with goog", topic)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.~+%", c) >= 0) {
			return fmt.Errorf("invalid Pub/Sub topic %q: only letters, digits and - _ . ~ + %% are allowed", topic)
		}
	}
	return nil
}

// topic returns the topic's publisher, ordering enabled, creating the topic first when
// CreateTopics says so.
func (p *Publisher) topic(ctx context.Context, name string) (*gpubsub.Publisher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.topics[name]; ok {
		return t, nil
	}
	if p.cfg.CreateTopics {
		_, err := p.c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + p.c.Project() + "/topics/" + name})
		if err != nil && status.Code(err) != codes.AlreadyExists {
			return nil, classify(fmt.Errorf("create topic %s: %w", name, err))
		}
	}
	t := p.c.Publisher(name)
	t.EnableMessageOrdering = true
	p.topics[name] = t
	return t, nil
}

// Publish implements broker.Publisher. A batch's messages are handed to the client at
// once, in order; each answer is its message's.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	out := make([]*gpubsub.Message, len(msgs))
	topics := make([]*gpubsub.Publisher, len(msgs))
	res := broker.Sequence(ctx, msgs, broker.Schedule{}, broker.Sender{
		Prepare: func(ctx context.Context, i int) (err error) {
			out[i], topics[i], err = p.prepare(ctx, &msgs[i])
			return err
		},
		Send: func(ctx context.Context, i int) (broker.Future, error) {
			return published{topics[i].Publish(ctx, out[i])}, nil
		},
		Classify: classify,
	})
	// The client paused each key whose message failed (it fails a key's bundle as a
	// whole; broker.Sequence charges only the first); resume them so the retry goes
	// through.
	resumed := map[*gpubsub.Publisher]map[string]bool{}
	for i, r := range res {
		if r.Err == nil || topics[i] == nil || out[i] == nil {
			continue
		}
		if resumed[topics[i]] == nil {
			resumed[topics[i]] = map[string]bool{}
		}
		if k := msgs[i].Key; !resumed[topics[i]][k] {
			resumed[topics[i]][k] = true
			topics[i].ResumePublish(k)
		}
	}
	return res
}

// prepare refuses what Pub/Sub cannot take and renders the message for its topic.
func (p *Publisher) prepare(ctx context.Context, m *broker.Message) (*gpubsub.Message, *gpubsub.Publisher, error) {
	if err := ValidateTopic(m.Topic); err != nil {
		return nil, nil, broker.Permanent(err)
	}
	attrs := make(map[string]string, m.HeaderCount())
	valid := true
	m.EachHeader(func(k, v string) {
		attrs[k] = v
		valid = valid && utf8.ValidString(k) && utf8.ValidString(v) && !strings.HasPrefix(strings.ToLower(k), "goog") && len(k) <= 256 && len(v) <= 1024
	})
	size := len(m.Payload)
	for k, v := range attrs {
		size += len(k) + len(v)
	}
	if p.cfg.MaxMessageBytes > 0 && size > p.cfg.MaxMessageBytes {
		return nil, nil, broker.Permanent(fmt.Errorf("message of %d bytes exceeds the limit of %d", size, p.cfg.MaxMessageBytes))
	}
	if !valid {
		return nil, nil, broker.Permanent(errors.New("a header Pub/Sub cannot carry as an attribute (invalid UTF-8, a goog prefix, a name over 256 or a value over 1024 bytes)"))
	}
	t, err := p.topic(ctx, m.Topic)
	if err != nil {
		return nil, nil, err
	}
	return &gpubsub.Message{Data: m.Payload, Attributes: attrs, OrderingKey: m.Key}, t, nil
}

// published is a Pub/Sub publish's answer to come.
type published struct{ r *gpubsub.PublishResult }

// Wait implements broker.Future. A key the client paused after an earlier failure
// is held back.
func (f published) Wait(ctx context.Context) error {
	_, err := f.r.Get(ctx)
	var paused gpubsub.ErrPublishingPaused
	if errors.As(err, &paused) {
		return fmt.Errorf("%w (%v)", broker.ErrHeldBack, err) //nolint:errorlint // held back, not failed: the cause is told, not wrapped, or errors.As would find a permanent failure in it
	}
	return err
}

// classify maps a Pub/Sub error to its class.
func classify(err error) error {
	switch status.Code(err) {
	case codes.NotFound:
		return broker.Deferred(fmt.Errorf("%w (create the topic)", err))
	case codes.InvalidArgument, codes.PermissionDenied, codes.FailedPrecondition:
		return broker.Permanent(err)
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unauthenticated, codes.Canceled:
		return broker.Unavailable(err)
	}
	return err // retried, counting an attempt
}

// Features implements broker.Publisher.
func (p *Publisher) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// Close implements broker.Publisher: it flushes and stops every topic publisher.
func (p *Publisher) Close() error {
	p.mu.Lock()
	for _, t := range p.topics {
		t.Stop()
	}
	p.topics = map[string]*gpubsub.Publisher{}
	p.mu.Unlock()
	if p.own {
		return p.c.Close()
	}
	return nil
}
