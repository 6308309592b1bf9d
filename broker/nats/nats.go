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
	// MaxControlLineDefault is the NATS server's default max_control_line: a
	// publish whose protocol line (subject, reply inbox, sizes) is longer makes the
	// server answer -ERR and close the connection.
	MaxControlLineDefault = 4096
)

// controlLineOverhead is what a JetStream publish's protocol line holds besides its
// subject, at most: "HPUB ", the reply inbox nats.go makes, two sizes, separators.
const controlLineOverhead = 128

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
	// MaxControlLine is the server's max_control_line. A message whose subject
	// would make a longer protocol line is refused permanently before it is sent:
	// sent, it would make the server close the connection, a failure of the
	// connection caused by one message. Default MaxControlLineDefault.
	MaxControlLine int
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
	if out.MaxControlLine <= 0 {
		out.MaxControlLine = MaxControlLineDefault
	}
	return out
}

// Publisher publishes to JetStream. Build it with New or Dial.
type Publisher struct {
	conn *broker.Conn[session] // Dial's connection is dialed again when it closes for good
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

// session is one NATS connection and its JetStream context.
type session struct {
	nc *nats.Conn
	js jetstream.JetStream
	// closed is closed when a connection Dial opened closes for good: pending
	// acknowledgements will never come (nil for a caller's connection).
	closed <-chan struct{}
}

// New returns a publisher on a JetStream context the caller built, and owns: the
// publisher never closes it, nor dials again if it closes for good.
func New(js jetstream.JetStream, cfg *Config) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("nats publisher: JetStream is nil")
	}
	s := session{nc: js.Conn(), js: js}
	conn := broker.NewConn(func(context.Context) (session, error) { return s, nil }, func(session) bool { return false }, func(session) {})
	_ = conn.Connect(context.Background()) // hands s over; it cannot fail
	return newPublisher(conn, cfg), nil
}

func newPublisher(conn *broker.Conn[session], cfg *Config) *Publisher {
	return &Publisher{
		conn: conn,
		cfg:  cfg.withDefaults(),
		// No client-side retry on "no responders": a retried message could land after
		// a later message of its key. The relay retries the batch in order instead.
		opts:    []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)},
		covered: map[string]int{},
	}
}

// Dial connects to url, checks that JetStream is enabled, and returns a publisher
// that owns the connection: nats.go reconnects it after an outage, and when it
// closes for good (a server's -ERR, revoked credentials) the publisher dials again,
// with backoff, on the next Publish.
func Dial(ctx context.Context, url string, cfg *Config) (*Publisher, error) {
	c := cfg.withDefaults()
	dial := func(ctx context.Context) (session, error) {
		closed := make(chan struct{})
		nc, err := nats.Connect(url,
			nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
			nats.Name("outbox-relay"),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(250*time.Millisecond),
			// While disconnected, fail fast instead of buffering: the relay backs off
			// and retries the batch in order.
			nats.ReconnectBufSize(-1),
		)
		if err != nil {
			return session{}, fmt.Errorf("connect to NATS at %s: %w", redact.Endpoint(url), err)
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(c.AckTimeout), jetstream.WithPublishAsyncMaxPending(c.MaxPending))
		if err != nil {
			nc.Close()
			return session{}, fmt.Errorf("NATS JetStream: %w", err)
		}
		if _, err := js.AccountInfo(ctx); err != nil {
			nc.Close()
			return session{}, fmt.Errorf("NATS at %s: JetStream is not available: %w", redact.Endpoint(url), err)
		}
		return session{nc: nc, js: js, closed: closed}, nil
	}
	// Not js.CleanupPublisher on close: called right after a first publish it can
	// leave nats.go's reconnect watcher blocked on a nil channel (a goroutine leak).
	// Closing the connection ends the watcher and every pending ack.
	conn := broker.NewConn(dial, func(s session) bool { return s.nc.IsClosed() }, func(s session) { s.nc.Close() })
	if err := conn.Connect(ctx); err != nil {
		return nil, err
	}
	return newPublisher(conn, &c), nil
}

// Features implements broker.Publisher.
func (p *Publisher) Features() broker.Features {
	f := broker.Features{BrokerDedup: true, PerKeyOrdering: true, Headers: true}
	if s, ok := p.conn.Current(); ok {
		f.MaxMessageBytes = int(s.nc.MaxPayload())
	}
	return f
}

// Close implements broker.Publisher: it closes the connection Dial opened.
func (p *Publisher) Close() error {
	p.conn.Close()
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
// and the call waits for every acknowledgement (broker.Sequence: a key's later
// messages are held behind its refused one, nothing more goes out after a failure of
// the connection).
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	s, err := p.conn.Get(ctx)
	if err != nil {
		return broker.AllUnavailable(len(msgs), err)
	}
	out := make([]*nats.Msg, len(msgs))
	maxPayload := int(s.nc.MaxPayload())
	refreshed := map[string]bool{} // subjects whose stream limit was asked again
	return broker.Sequence(ctx, msgs, broker.Schedule{AckTimeout: p.cfg.AckTimeout}, broker.Sender{
		Prepare: func(ctx context.Context, i int) (err error) {
			out[i], err = p.prepare(ctx, s.js, &msgs[i], maxPayload, refreshed)
			return err
		},
		Send: func(_ context.Context, i int) (broker.Future, error) {
			f, err := s.js.PublishMsgAsync(out[i], p.opts...)
			if err != nil {
				return nil, err
			}
			return ack{f: f, closed: s.closed}, nil
		},
		Classify: classify,
	})
}

// prepare makes every check the server would make, before sending: a subject whose
// protocol line is too long (sent, it would close the connection), a stream that
// covers the subject (else Deferred), headers NATS cannot carry intact, the server's
// max_payload and the stream's max_msg_size; and renders the message.
func (p *Publisher) prepare(ctx context.Context, js jetstream.JetStream, m *broker.Message, maxPayload int, refreshed map[string]bool) (*nats.Msg, error) {
	if len(m.Topic)+controlLineOverhead > p.cfg.MaxControlLine {
		return nil, broker.Permanent(fmt.Errorf("subject of %d bytes: the publish would exceed the server's max_control_line of %d (a shorter aggregate type or topic template)",
			len(m.Topic), p.cfg.MaxControlLine))
	}
	streamMax, err := p.ensureStream(ctx, js, m.Topic)
	if err != nil {
		return nil, err
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
		return nil, bad
	}
	set(jetstream.MsgIDHeader, m.DedupKey())
	set(HeaderKey, m.Key)
	if maxPayload > 0 && size > maxPayload {
		return nil, broker.Permanent(fmt.Errorf("message of %d bytes exceeds the server's max_payload of %d", size, maxPayload))
	}
	if streamMax >= 0 && len(m.Payload) > streamMax && !refreshed[m.Topic] {
		// The limit is cached: an operator may have raised it (then replayed the
		// dead letters it made). Ask once per subject and batch before refusing.
		refreshed[m.Topic] = true
		p.forget(m.Topic)
		if streamMax, err = p.ensureStream(ctx, js, m.Topic); err != nil {
			return nil, err
		}
	}
	if streamMax >= 0 && len(m.Payload) > streamMax {
		return nil, broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the stream's max_msg_size of %d", len(m.Payload), streamMax))
	}
	return &nats.Msg{Subject: m.Topic, Data: m.Payload, Header: hdr}, nil
}

// ack is a JetStream acknowledgement to come.
type ack struct {
	f      jetstream.PubAckFuture
	closed <-chan struct{} // a connection Dial opened closed for good: no answer will come
}

// Wait implements broker.Future.
func (a ack) Wait(ctx context.Context) error {
	select { // an answer already come wins
	case <-a.f.Ok():
		return nil
	case err := <-a.f.Err():
		return err
	default:
	}
	select {
	case <-a.f.Ok():
		return nil
	case err := <-a.f.Err():
		return err
	case <-a.closed:
		select {
		case <-a.f.Ok():
			return nil
		case err := <-a.f.Err():
			return err
		default:
			return broker.Unavailable(nats.ErrConnectionClosed)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ensureStream checks once per subject that a stream covers it, and returns that
// stream's max message size (-1 for none). Its errors are never a message's: a
// subject no stream covers is broker.Deferred (that subject waits, others go on),
// anything else broker.Unavailable (or the context's error).
func (p *Publisher) ensureStream(ctx context.Context, js jetstream.JetStream, subject string) (int, error) {
	p.mu.Lock()
	max, ok := p.covered[subject]
	p.mu.Unlock()
	if ok {
		return max, nil
	}
	max, err := p.lookupStream(ctx, js, subject)
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

func (p *Publisher) lookupStream(ctx context.Context, js jetstream.JetStream, subject string) (int, error) {
	name, err := js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) && p.cfg.CreateStream {
		// Create, never update: an existing stream of that name is someone's
		// configuration (subjects, limits) and stays as it is.
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:     p.cfg.StreamName,
			Subjects: p.cfg.StreamSubjects,
			Storage:  jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return 0, broker.Deferred(fmt.Errorf("subject %q: stream %q exists but does not cover it; it is left unchanged (add the subject to it, or name another stream): %w",
				subject, p.cfg.StreamName, ErrNoStream))
		}
		if err == nil {
			name, err = js.StreamNameBySubject(ctx, subject)
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		// Not the message's fault: it must wait for an operator, not go dead-letter.
		return 0, broker.Deferred(fmt.Errorf("subject %q: %w", subject, ErrNoStream))
	case err != nil:
		return 0, fmt.Errorf("subject %q: stream lookup: %w", subject, err)
	}
	st, err := js.Stream(ctx, name)
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
