// Package nats publishes outbox events to NATS JetStream.
//
// Each message goes to its subject (outbox.event.<aggregatetype> by default) with the
// payload as data and these headers: Nats-Msg-Id = event id (JetStream drops a
// duplicate within the stream's dedup window), Outbox-Key = the message key (NATS has
// no key), and the relay's wire-format headers (id, eventType, aggregateType,
// aggregateId, ...).
//
// It publishes into an existing stream that covers the subject; if none does, every
// message for that subject fails with ErrNoStream, unless Config.CreateStream asks for
// one to be created.
package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/redact"
)

// Defaults.
const (
	StreamNameDefault    = "OUTBOX"
	StreamSubjectDefault = "outbox.event.>"
	AckTimeoutDefault    = 10 * time.Second
	MaxPendingDefault    = 4096
)

// HeaderKey carries the message key; NATS has no key of its own.
const HeaderKey = "Outbox-Key"

// ErrNoStream means no JetStream stream covers a subject.
var ErrNoStream = errors.New("no JetStream stream covers the subject (create one, or run the relay with --nats-create-stream)")

// Config configures a Publisher. The zero value (or nil) gives the defaults.
type Config struct {
	// CreateStream creates StreamName over StreamSubjects when no stream covers a
	// subject.
	CreateStream bool
	// StreamName is the stream CreateStream creates. Default StreamNameDefault.
	StreamName string
	// StreamSubjects are its subjects. Default [StreamSubjectDefault].
	StreamSubjects []string
	// AckTimeout bounds the wait for a batch's acknowledgements, counted from its
	// last send, whatever client New was given: an acknowledgement that never comes
	// (a cut network, a paused server) fails the rest of the batch as the
	// connection's failure. Default AckTimeoutDefault.
	AckTimeout time.Duration
	// MaxPending bounds unacknowledged publishes in flight (used by Dial).
	MaxPending int
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.StreamName == "" {
		out.StreamName = StreamNameDefault
	}
	if len(out.StreamSubjects) == 0 {
		out.StreamSubjects = []string{StreamSubjectDefault}
	}
	if out.AckTimeout <= 0 {
		out.AckTimeout = AckTimeoutDefault
	}
	if out.MaxPending <= 0 {
		out.MaxPending = MaxPendingDefault
	}
	return out
}

// Publisher publishes to JetStream. Build it with New or Dial.
type Publisher struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	own  bool // Dial opened nc, Close closes it
	cfg  Config
	opts []jetstream.PublishOpt

	mu      sync.Mutex
	covered map[string]int // subject -> its stream's max message size (-1: none), once checked
}

var (
	_ broker.Publisher      = (*Publisher)(nil)
	_ broker.TopicEscaper   = (*Publisher)(nil)
	_ broker.TopicValidator = (*Publisher)(nil)
)

// New returns a publisher on a JetStream context the caller built (and closes).
func New(js jetstream.JetStream, cfg *Config) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("nats publisher: JetStream is nil")
	}
	return &Publisher{
		js:  js,
		nc:  js.Conn(),
		cfg: cfg.withDefaults(),
		// No client-side retry on "no responders": a retried message could land after
		// a later message of its key. The relay retries the batch in order instead.
		opts:    []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)},
		covered: map[string]int{},
	}, nil
}

// Dial connects to url, checks that JetStream is enabled, and returns a publisher
// that owns the connection.
func Dial(ctx context.Context, url string, cfg *Config) (*Publisher, error) {
	c := cfg.withDefaults()
	nc, err := nats.Connect(url,
		nats.Name("outbox-relay"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		// While disconnected, fail fast instead of buffering: the relay backs off and
		// retries the batch in order.
		nats.ReconnectBufSize(-1),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redact.URL(url), err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(c.AckTimeout), jetstream.WithPublishAsyncMaxPending(c.MaxPending))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("NATS JetStream: %w", err)
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("NATS at %s: JetStream is not available: %w", redact.URL(url), err)
	}
	p, err := New(js, &c)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.own = true
	return p, nil
}

// Features implements broker.Publisher.
func (p *Publisher) Features() broker.Features {
	return broker.Features{BrokerDedup: true, PerKeyOrdering: true, Headers: true, MaxMessageBytes: int(p.nc.MaxPayload())}
}

// Close implements broker.Publisher.
func (p *Publisher) Close() error {
	if p.own {
		// Not js.CleanupPublisher: called right after a first publish it can leave
		// nats.go's reconnect watcher blocked on a nil channel (a goroutine leak).
		// Closing the connection ends the watcher and every pending ack.
		p.nc.Close()
	}
	return nil
}

// EscapeTopicToken implements broker.TopicEscaper: a value placed in a subject can
// never add tokens or wildcards. '.', '*', '>', '%', white space and control bytes
// become %XX; an empty value becomes "_".
func (p *Publisher) EscapeTopicToken(s string) string { return EscapeToken(s) }

// EscapeToken is EscapeTopicToken without a publisher.
func EscapeToken(s string) string {
	return broker.EscapeToken(s, func(c byte) bool { return c == '.' || c == '*' || c == '>' || c <= ' ' || c == 0x7f })
}

// Publish implements broker.Publisher. Messages are sent in order, asynchronously,
// and the call waits for every acknowledgement. After the first failure that is not
// the message's own fault, the rest of the batch is not sent, so no later message of
// a key can overtake an earlier one.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	maxPayload := int(p.nc.MaxPayload())
	var stop error
	var hold broker.KeyHold
	deferred := map[string]error{} // subjects with no stream, asked once per batch
	refreshed := map[string]bool{} // subjects whose stream limit was asked again
	for i, m := range msgs {
		if stop == nil {
			stop = ctx.Err()
		}
		if stop != nil {
			res[i].Err = stop
			continue
		}
		if res[i].Err = hold.Held(m.Key); res[i].Err != nil {
			continue
		}
		if err := deferred[m.Topic]; err != nil {
			res[i].Err = err // its subject's stream was missing a moment ago
			continue
		}
		streamMax, err := p.ensureStream(ctx, m.Topic)
		if err != nil {
			res[i].Err = err
			if broker.IsDeferred(err) {
				deferred[m.Topic] = err // this subject waits; other subjects go on
			} else {
				stop = err // the connection's (ensureStream says so): nothing more goes out
			}
			continue
		}
		n := m.HeaderCount() + 2
		hdr := make(nats.Header, n)
		vals := make([]string, 0, n) // one backing array for every one-value header
		set := func(k, v string) {
			vals = append(vals, v)
			hdr[k] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
		size := len(m.Payload)
		var bad error // a header NATS cannot carry intact: checked as it is rendered
		m.EachHeader(func(k, v string) {
			if bad == nil {
				bad = broker.CheckHeader(k, v)
			}
			set(k, v)
			size += len(k) + len(v) + 4
		})
		if bad != nil {
			res[i].Err = bad
			hold.Refuse(m.Key, bad)
			continue
		}
		set(jetstream.MsgIDHeader, m.ID)
		set(HeaderKey, m.Key)
		nm := &nats.Msg{Subject: m.Topic, Data: m.Payload, Header: hdr}
		// Refuse what the server would refuse, before sending: the key's later
		// messages can then be held back instead of overtaking this one.
		if res[i].Err = hold.Admit(&m, size, maxPayload); res[i].Err != nil {
			continue // over the server's max_payload
		}
		if streamMax >= 0 && len(m.Payload) > streamMax && !refreshed[m.Topic] {
			// The limit is cached: an operator may have raised it (then replayed
			// the dead letters it made). Ask once per subject and batch before
			// refusing.
			refreshed[m.Topic] = true
			p.forget(m.Topic)
			if streamMax, err = p.ensureStream(ctx, m.Topic); err != nil {
				res[i].Err = err
				if broker.IsDeferred(err) {
					deferred[m.Topic] = err
				} else {
					stop = err
				}
				continue
			}
		}
		if res[i].Err = hold.Admit(&m, len(m.Payload), streamMax); res[i].Err != nil {
			continue // over the stream's max_msg_size
		}
		f, err := p.js.PublishMsgAsync(nm, p.opts...)
		if err != nil {
			res[i].Err = classify(err)
			if broker.IsUnavailable(res[i].Err) || ctx.Err() != nil {
				stop = res[i].Err
			} else {
				hold.Refuse(m.Key, res[i].Err) // this message's failure: its key waits, others go on
			}
			continue
		}
		futures[i] = f
	}
	p.await(ctx, futures, res)
	return res
}

// await waits for the acknowledgements, at most AckTimeout after the last send: a
// caller's JetStream client may have no publish timeout, and a reply lost on a cut
// network would otherwise hold the batch until ctx ends.
func (p *Publisher) await(ctx context.Context, futures []jetstream.PubAckFuture, res []broker.Result) {
	timer := time.NewTimer(p.cfg.AckTimeout)
	defer timer.Stop()
	var expired bool
	for i, f := range futures {
		if f == nil {
			continue
		}
		if expired {
			select { // answered before the deadline, or not at all
			case <-f.Ok():
			case err := <-f.Err():
				res[i].Err = classify(err)
			default:
				res[i].Err = p.ackTimeout()
			}
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			res[i].Err = classify(err)
		case <-timer.C:
			expired = true
			res[i].Err = p.ackTimeout()
		case <-ctx.Done():
			res[i].Err = ctx.Err()
		}
	}
}

func (p *Publisher) ackTimeout() error {
	return broker.Unavailable(fmt.Errorf("no acknowledgement within %v: %w", p.cfg.AckTimeout, jetstream.ErrAsyncPublishTimeout))
}

// ensureStream checks once per subject that a stream covers it, and returns that
// stream's max message size (-1 for none). Its errors are never a message's: a
// subject no stream covers is broker.Deferred (that subject waits, others go on),
// anything else broker.Unavailable (or the context's error).
func (p *Publisher) ensureStream(ctx context.Context, subject string) (int, error) {
	p.mu.Lock()
	max, ok := p.covered[subject]
	p.mu.Unlock()
	if ok {
		return max, nil
	}
	max, err := p.lookupStream(ctx, subject)
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if !broker.IsUnavailable(err) && !broker.IsDeferred(err) {
			err = broker.Unavailable(err)
		}
		return 0, err
	}
	p.mu.Lock()
	p.covered[subject] = max
	p.mu.Unlock()
	return max, nil
}

// forget drops what ensureStream knows of subject.
func (p *Publisher) forget(subject string) {
	p.mu.Lock()
	delete(p.covered, subject)
	p.mu.Unlock()
}

func (p *Publisher) lookupStream(ctx context.Context, subject string) (int, error) {
	name, err := p.js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) && p.cfg.CreateStream {
		// Create, never update: an existing stream of that name is someone's
		// configuration (subjects, limits) and stays as it is.
		_, err = p.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:     p.cfg.StreamName,
			Subjects: p.cfg.StreamSubjects,
			Storage:  jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return 0, broker.Deferred(fmt.Errorf("subject %q: stream %q exists but does not cover it; it is left unchanged (add the subject to it, or name another stream): %w",
				subject, p.cfg.StreamName, ErrNoStream))
		}
		if err == nil {
			name, err = p.js.StreamNameBySubject(ctx, subject)
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		// Not the message's fault: it must wait for an operator, not go dead-letter.
		return 0, broker.Deferred(fmt.Errorf("subject %q: %w", subject, ErrNoStream))
	case err != nil:
		return 0, fmt.Errorf("subject %q: stream lookup: %w", subject, err)
	}
	st, err := p.js.Stream(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("stream %q: %w", name, err)
	}
	return int(st.CachedInfo().Config.MaxMsgSize), nil
}

// ValidateTopic implements broker.TopicValidator: a subject must be non-empty tokens
// separated by '.', with no white space or wildcard, so a bad topic template fails
// at start instead of dead-lettering every event.
func (p *Publisher) ValidateTopic(subject string) error { return ValidateSubject(subject) }

// ValidateSubject is ValidateTopic without a publisher.
func ValidateSubject(subject string) error {
	if subject == "" {
		return errors.New("empty NATS subject")
	}
	for _, tok := range strings.Split(subject, ".") {
		if tok == "" {
			return fmt.Errorf("NATS subject %q has an empty token", subject)
		}
		if tok == "*" || tok == ">" {
			return fmt.Errorf("NATS subject %q holds a wildcard; publish subjects must be literal", subject)
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c <= ' ' || c == 0x7f {
				return fmt.Errorf("NATS subject %q holds white space or a control character", subject)
			}
		}
	}
	return nil
}

// classify maps NATS errors to the broker package's classes.
func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrHeadersNotSupported):
		return broker.Permanent(err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return broker.Permanent(err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs), errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return broker.Unavailable(err)
	}
	return err
}
