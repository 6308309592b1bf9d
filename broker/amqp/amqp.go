// Package amqp publishes outbox events to RabbitMQ (AMQP 0-9-1) through a topic
// exchange: routing key = topic, message_id = event id, persistent delivery, the
// wire-format headers as message headers (and the key as outbox-key), publisher
// confirms, and mandatory publishing so an event no queue would receive is a failure,
// not a silent drop.
//
// The publisher reconnects by itself: a closed connection or channel is reopened on
// the next Publish.
package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/redact"
)

// Defaults.
const (
	ExchangeDefault = "outbox"
	HeaderKey       = "outbox-key"
)

// ErrUnroutable means no queue is bound for the message's routing key.
var ErrUnroutable = errors.New("unroutable: no queue is bound for the routing key")

// Config configures a Publisher.
type Config struct {
	// Exchange is the topic exchange, declared durable unless NoDeclare. Default
	// ExchangeDefault.
	Exchange string
	// NoDeclare uses an exchange someone else declared.
	NoDeclare bool
	// MaxMessageBytes, if positive, refuses larger payloads before sending them (set
	// it to the server's max_message_size: a larger body closes the channel).
	MaxMessageBytes int
	// ConnectionName shows in the RabbitMQ management UI. Default "outbox-relay".
	ConnectionName string
	// DialTimeout bounds connecting. Default 10s.
	DialTimeout time.Duration
	// Dial, if set, opens the connection instead of dialing the URL: for connections
	// you build yourself (TLS client certificates, custom SASL). It is called again
	// to reconnect.
	Dial func() (*amqp.Connection, error)
}

// Publisher publishes to RabbitMQ. Build it with Dial.
type Publisher struct {
	cfg Config
	url string

	mu   sync.Mutex            // one batch at a time on the channel
	conn *broker.Conn[session] // dialed again once the connection or channel closed
}

// session is one connection and its confirming channel.
type session struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// Dial validates url (amqp:// or amqps://) and cfg (nil for the defaults) and
// connects once, so a bad URL or an unreachable server is reported at once. The
// publisher owns the connection and reconnects when it is lost.
func Dial(ctx context.Context, url string, cfg *Config) (*Publisher, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	p := &Publisher{cfg: *cfg, url: url}
	cfg = &p.cfg
	if cfg.Exchange == "" {
		cfg.Exchange = ExchangeDefault
	}
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = "outbox-relay"
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Dial == nil {
		if _, err := amqp.ParseURI(url); err != nil {
			return nil, fmt.Errorf("AMQP URL %s: %w", redact.Endpoint(url), err)
		}
	}
	p.conn = broker.NewConn(func(context.Context) (session, error) { return p.open() },
		func(s session) bool { return s.conn.IsClosed() || s.ch.IsClosed() },
		func(s session) { _ = s.conn.Close() })
	if err := p.conn.Connect(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Publisher) dial() (*amqp.Connection, error) {
	if p.cfg.Dial != nil {
		return p.cfg.Dial()
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(p.cfg.ConnectionName)
	return amqp.DialConfig(p.url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(p.cfg.DialTimeout)})
}

// open connects and opens the confirming channel (a closed channel, after a
// channel error, takes its connection with it: both are opened anew).
func (p *Publisher) open() (session, error) {
	conn, err := p.dial()
	if err != nil {
		return session{}, broker.Unavailable(fmt.Errorf("connect to RabbitMQ at %s: %w", redact.Endpoint(p.url), err))
	}
	fail := func(err error) (session, error) {
		_ = conn.Close()
		return session{}, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail(broker.Unavailable(fmt.Errorf("RabbitMQ channel: %w", err)))
	}
	if err := ch.Confirm(false); err != nil {
		return fail(broker.Unavailable(fmt.Errorf("RabbitMQ confirms: %w", err)))
	}
	if !p.cfg.NoDeclare {
		if err := ch.ExchangeDeclare(p.cfg.Exchange, "topic", true, false, false, false, nil); err != nil {
			return fail(fmt.Errorf("declare exchange %q: %w", p.cfg.Exchange, err))
		}
	}
	return session{conn: conn, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 4096))}, nil
}

var (
	_ broker.Publisher      = (*Publisher)(nil)
	_ broker.TopicValidator = (*Publisher)(nil)
)

// Publish implements broker.Publisher: every message is published in order with a
// publisher confirm, then the confirms are awaited (broker.Sequence).
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	ss, err := p.conn.Get(ctx)
	if err != nil {
		return broker.AllUnavailable(len(msgs), err) // the connection's failure, not the messages'
	}
	pubs := make([]amqp.Publishing, len(msgs))
	returned := map[string]amqp.Return{}
	return broker.Sequence(ctx, msgs, broker.Schedule{}, broker.Sender{
		Prepare: func(_ context.Context, i int) (err error) {
			pubs[i], err = p.prepare(&msgs[i], ss.conn.Config.FrameSize)
			return err
		},
		Send: func(ctx context.Context, i int) (broker.Future, error) {
			dc, err := ss.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, msgs[i].Topic, true, false, pubs[i])
			if err != nil {
				return nil, err
			}
			return confirm{dc: dc, id: msgs[i].ID, returns: ss.returns, returned: returned}, nil
		},
		Classify: func(err error) error { return classify(ctx, err) },
	})
}

// prepare refuses what AMQP cannot carry (sent, it would close the channel and fail
// the whole batch with it) and renders the message. frameMax is the connection's
// negotiated frame size (frame_max; 0 or less: no limit).
func (p *Publisher) prepare(m *broker.Message, frameMax int) (amqp.Publishing, error) {
	if p.cfg.MaxMessageBytes > 0 && len(m.Payload) > p.cfg.MaxMessageBytes {
		return amqp.Publishing{}, broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the limit of %d", len(m.Payload), p.cfg.MaxMessageBytes))
	}
	if err := checkShortStrings(m); err != nil {
		return amqp.Publishing{}, broker.Permanent(err)
	}
	headers := amqp.Table{HeaderKey: m.Key}
	m.EachHeader(func(k, v string) { headers[k] = v })
	ct := m.MediaType()
	if n := headerFrameBytes(m.ID, m.EventType, ct, headers); frameMax > 0 && n > frameMax {
		// The properties travel in one content-header frame, which cannot be split:
		// RabbitMQ closes the connection on a larger one, failing the whole batch.
		return amqp.Publishing{}, broker.Permanent(fmt.Errorf("its properties and headers take %d bytes, and one AMQP frame holds %d (frame_max)", n, frameMax))
	}
	return amqp.Publishing{
		MessageId:    m.ID,
		DeliveryMode: amqp.Persistent,
		ContentType:  ct,
		Type:         m.EventType,
		Timestamp:    time.Now(),
		Headers:      headers,
		Body:         m.Payload,
	}, nil
}

// confirm is a publisher confirm to come. A mandatory message no queue took comes
// back (basic.return) before its confirm, so once confirmed, the returns that came
// tell whether it was routed.
type confirm struct {
	dc       *amqp.DeferredConfirmation
	id       string
	returns  <-chan amqp.Return
	returned map[string]amqp.Return // the batch's returns so far, by message id
}

// Wait implements broker.Future.
func (c confirm) Wait(ctx context.Context) error {
	ack, err := c.dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ack {
		return broker.Unavailable(errors.New("RabbitMQ nacked the message (queue full or internal error)"))
	}
	for drained := false; !drained; {
		select {
		case r, ok := <-c.returns:
			if !ok {
				drained = true // the channel closed: later confirms fail by themselves
				break
			}
			c.returned[r.MessageId] = r
		default:
			drained = true
		}
	}
	if r, ok := c.returned[c.id]; ok {
		// The topic's, not the connection's: other topics go on, this message is
		// retried on its own schedule (and dead-lettered if no queue is ever bound).
		return broker.Deferred(fmt.Errorf("%w %q (%s)", ErrUnroutable, r.RoutingKey, r.ReplyText))
	}
	return nil
}

// headerFrameBytes is the size of a message's content-header frame (AMQP 0-9-1
// 4.2.6): the frame's 8 bytes, the header's 14, then the properties the publisher
// sets (content type, headers as long strings, delivery mode, message id, timestamp
// and type).
func headerFrameBytes(id, typ, contentType string, headers amqp.Table) int {
	n := 8 + 14 + 1 + len(contentType) + 4 + 1 + 1 + len(id) + 8 + 1 + len(typ)
	for k, v := range headers {
		s, _ := v.(string)
		n += 1 + len(k) + 1 + 4 + len(s)
	}
	return n
}

// checkShortStrings refuses what AMQP carries as a short string (at most 255 bytes):
// the routing key, message id, type and header names.
func checkShortStrings(m *broker.Message) error {
	if err := ValidateTopic(m.Topic); err != nil {
		return err
	}
	if len(m.ID) > 255 || len(m.EventType) > 255 {
		return errors.New("event id or type longer than 255 bytes (an AMQP short string)")
	}
	var long string
	m.EachHeader(func(k, _ string) {
		if len(k) > 255 {
			long = k[:32] + "..."
		}
	})
	if long != "" {
		return fmt.Errorf("header name %q longer than 255 bytes (an AMQP short string)", long)
	}
	return nil
}

// ValidateTopic implements broker.TopicValidator: a routing key is at most 255 bytes.
func (p *Publisher) ValidateTopic(topic string) error { return ValidateTopic(topic) }

// ValidateTopic is the method without a publisher.
func ValidateTopic(topic string) error {
	if len(topic) > 255 {
		return fmt.Errorf("routing key of %d bytes: AMQP allows at most 255", len(topic))
	}
	return nil
}

func classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		return broker.Permanent(err) // e.g. a body over max_message_size
	}
	return broker.Unavailable(err)
}

// Features implements broker.Publisher. RabbitMQ has no dedup: consumers dedup by
// message_id (the inbox does).
func (p *Publisher) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// Close implements broker.Publisher.
func (p *Publisher) Close() error {
	p.conn.Close()
	return nil
}
