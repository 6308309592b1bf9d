// Package mqtt publishes outbox events over MQTT 5 (Eclipse Paho) at QoS 1: each
// message waits for the broker's PUBACK. The wire-format headers travel as user
// properties, the key as the user property outbox-key. Topics use '/' separators
// (the relay's default template for MQTT is outbox/event/${aggregatetype}); values put
// into a topic are escaped so they can never add levels or wildcards.
//
// MQTT has no dedup: consumers dedup by the id property (the inbox does). The
// publisher reconnects by itself on the next Publish after a lost connection.
package mqtt

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/eclipse/paho.golang/paho"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/internal/wire"
)

// Defaults.
const (
	TopicTemplateDefault = "outbox/event/${aggregatetype}"
	ConcurrencyDefault   = 16
	HeaderKey            = "outbox-key"
)

// Config configures a Publisher.
type Config struct {
	// ClientID identifies the session. Default "outbox-relay-" plus random hex.
	ClientID string
	// Concurrency is how many keys are published at once. Default ConcurrencyDefault.
	Concurrency int
	// MaxMessageBytes, if positive, refuses larger payloads before sending them. The
	// broker's own maximum packet size, when it announces one, applies too.
	MaxMessageBytes int
	// Timeout bounds connecting and each PUBACK. Default 10s.
	Timeout time.Duration
	// TLS configures mqtts:// connections. Default: the system roots.
	TLS *tls.Config
	// Connect, if set, returns a connected client instead of dialing the URL: for clients
	// you build yourself (WebSockets, custom auth). It is called again to reconnect.
	Connect func(ctx context.Context) (*paho.Client, error)
}

// Publisher publishes over MQTT. Build it with Dial.
type Publisher struct {
	cfg  Config
	addr string
	user *url.Userinfo
	tls  bool

	conn *broker.Conn[session] // dialed again once the broker closed it
}

// session is one MQTT connection and the largest packet its broker takes (0: no
// limit said).
type session struct {
	c      *paho.Client
	maxPkt int
}

// Dial validates rawURL (mqtt://[user:pass@]host:1883 or mqtts://...) and cfg (nil
// for the defaults) and connects once, so a bad URL or an unreachable broker is
// reported at once. The publisher owns the session and reconnects when it is lost.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Publisher, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	p := &Publisher{cfg: *cfg}
	if cfg.Connect == nil {
		u, err := url.Parse(rawURL)
		if err != nil || (u.Scheme != "mqtt" && u.Scheme != "mqtts" && u.Scheme != "tcp") || u.Host == "" {
			return nil, fmt.Errorf("MQTT URL %q: want mqtt://host:1883 or mqtts://host:8883", redact.Endpoint(rawURL))
		}
		p.addr, p.user, p.tls = u.Host, u.User, u.Scheme == "mqtts"
		if !strings.Contains(u.Host, ":") {
			p.addr += map[bool]string{true: ":8883", false: ":1883"}[p.tls]
		}
	}
	if p.cfg.ClientID == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		p.cfg.ClientID = "outbox-relay-" + hex.EncodeToString(b)
	}
	if p.cfg.Concurrency <= 0 {
		p.cfg.Concurrency = ConcurrencyDefault
	}
	if p.cfg.Timeout <= 0 {
		p.cfg.Timeout = 10 * time.Second
	}
	p.conn = broker.NewConn(p.dial, closed, disconnect)
	if err := p.conn.Connect(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// dial connects and opens a session (CleanStart: the relay keeps no session state).
func (p *Publisher) dial(ctx context.Context) (session, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if p.cfg.Connect != nil {
		c, err := p.cfg.Connect(ctx)
		if err != nil {
			return session{}, broker.Unavailable(fmt.Errorf("connect to MQTT broker: %w", err))
		}
		return session{c: c}, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", p.addr)
	if err == nil && p.tls {
		tc := tls.Client(conn, p.tlsConfig())
		if err = tc.HandshakeContext(ctx); err == nil {
			conn = tc
		}
	}
	if err != nil {
		return session{}, broker.Unavailable(fmt.Errorf("connect to MQTT broker at %s: %w", p.addr, err))
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, PacketTimeout: p.cfg.Timeout})
	cp := &paho.Connect{ClientID: p.cfg.ClientID, CleanStart: true, KeepAlive: 30}
	if p.user != nil {
		cp.Username, cp.UsernameFlag = p.user.Username(), true
		if pw, ok := p.user.Password(); ok {
			cp.Password, cp.PasswordFlag = []byte(pw), true
		}
	}
	ca, err := c.Connect(ctx, cp)
	if err != nil {
		_ = conn.Close()
		if ca != nil && ca.ReasonCode >= 0x80 {
			reason := ""
			if ca.Properties != nil {
				reason = ca.Properties.ReasonString
			}
			return session{}, broker.Unavailable(fmt.Errorf("MQTT broker at %s refused the connection: reason 0x%02x %s", p.addr, ca.ReasonCode, reason))
		}
		return session{}, broker.Unavailable(fmt.Errorf("connect to MQTT broker at %s: %w", p.addr, err))
	}
	s := session{c: c}
	if ca.Properties != nil && ca.Properties.MaximumPacketSize != nil {
		s.maxPkt = int(*ca.Properties.MaximumPacketSize)
	}
	return s, nil
}

// closed reports whether the broker (or the network) ended the session.
func closed(s session) bool {
	select {
	case <-s.c.Done():
		return true
	default:
		return false
	}
}

// disconnect ends a session.
func disconnect(s session) { _ = s.c.Disconnect(&paho.Disconnect{ReasonCode: 0}) }

func (p *Publisher) tlsConfig() *tls.Config {
	if p.cfg.TLS != nil {
		return p.cfg.TLS
	}
	host, _, _ := net.SplitHostPort(p.addr)
	return &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
}

var (
	_ broker.Publisher      = (*Publisher)(nil)
	_ broker.TopicEscaper   = (*Publisher)(nil)
	_ broker.TopicValidator = (*Publisher)(nil)
)

// Publish implements broker.Publisher: QoS 1, the messages of one key one after
// another, each after the previous one's PUBACK, Concurrency keys at once.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	s, err := p.conn.Get(ctx)
	if err != nil {
		return broker.AllUnavailable(len(msgs), err) // the connection's failure, not the messages'
	}
	pubs := make([]*paho.Publish, len(msgs))
	return broker.Sequence(ctx, msgs, broker.Schedule{Sequential: true, Concurrency: p.cfg.Concurrency, AckTimeout: p.cfg.Timeout}, broker.Sender{
		Prepare: func(_ context.Context, i int) (err error) {
			pubs[i], err = p.prepare(&msgs[i], s.maxPkt)
			return err
		},
		Send: func(ctx context.Context, i int) (broker.Future, error) {
			pctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
			defer cancel()
			pr, err := s.c.Publish(pctx, pubs[i])
			if pr != nil && pr.ReasonCode >= 0x80 {
				return broker.Answered{Err: classifyReason(pr.ReasonCode, pr.Properties)}, nil
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, broker.Unavailable(fmt.Errorf("MQTT publish: %w", err))
			}
			return broker.Answered{}, nil
		},
	})
}

// prepare refuses what the protocol or the broker cannot carry (sent, it would make
// the broker drop the connection, and every other message with it) and renders the
// PUBLISH packet.
func (p *Publisher) prepare(m *broker.Message, maxPkt int) (*paho.Publish, error) {
	if p.cfg.MaxMessageBytes > 0 && len(m.Payload) > p.cfg.MaxMessageBytes {
		return nil, broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the limit of %d", len(m.Payload), p.cfg.MaxMessageBytes))
	}
	if err := ValidateTopic(m.Topic); err != nil {
		return nil, broker.Permanent(err)
	}
	if err := broker.CheckHeaders(m); err != nil {
		return nil, err
	}
	if p := wire.HeaderValueProblem(m.Key); p != "" {
		return nil, broker.Permanent(fmt.Errorf("key: %s", p))
	}
	props := &paho.PublishProperties{}
	if !m.Verbatim {
		// A router's verbatim message carries its own headers only (CloudEvents on
		// MQTT reads every user property as an attribute).
		props.User = paho.UserProperties{{Key: HeaderKey, Value: m.Key}}
	}
	size := len(m.Payload) + len(m.Topic) + len(m.Key)
	m.EachHeader(func(k, v string) {
		props.User = append(props.User, paho.UserProperty{Key: k, Value: v})
		size += len(k) + len(v) + 5
	})
	if maxPkt > 0 && size+64 > maxPkt {
		return nil, broker.Permanent(fmt.Errorf("message of about %d bytes exceeds the broker's maximum packet size of %d", size, maxPkt))
	}
	props.ContentType = m.ContentType
	return &paho.Publish{QoS: 1, Topic: m.Topic, Payload: m.Payload, Properties: props}, nil
}

// classifyReason maps a PUBACK reason code (MQTT 5, section 3.4.2.1).
func classifyReason(code byte, props *paho.PublishResponseProperties) error {
	reason := ""
	if props != nil {
		reason = props.ReasonString
	}
	err := fmt.Errorf("MQTT broker refused the message: reason 0x%02x %s", code, reason)
	switch code {
	case 0x97: // quota exceeded
		return broker.Unavailable(err)
	case 0x80: // unspecified error
		return err
	}
	return broker.Permanent(err) // not authorized, topic name invalid, payload format invalid, ...
}

// EscapeTopicToken implements broker.TopicEscaper: '/', '+', '#', '%', NUL and control
// characters become %XX, an empty value "_".
func (p *Publisher) EscapeTopicToken(s string) string { return EscapeToken(s) }

// EscapeToken is EscapeTopicToken without a publisher.
func EscapeToken(s string) string {
	return broker.EscapeToken(s, func(c byte) bool { return c == '/' || c == '+' || c == '#' || c < ' ' || c == 0x7f })
}

// ValidateTopic implements broker.TopicValidator: an MQTT topic name is 1 to 65535
// bytes of UTF-8 with no NUL and no wildcard ('+', '#').
func (p *Publisher) ValidateTopic(topic string) error { return ValidateTopic(topic) }

// ValidateTopic is the method without a publisher.
func ValidateTopic(topic string) error {
	switch {
	case topic == "" || len(topic) > 65535:
		return fmt.Errorf("invalid MQTT topic %q: 1 to 65535 bytes", topic)
	case !utf8.ValidString(topic):
		return fmt.Errorf("invalid MQTT topic %q: not valid UTF-8", topic)
	case strings.ContainsAny(topic, "+#\x00"):
		return fmt.Errorf("invalid MQTT topic %q: holds a wildcard or NUL", topic)
	}
	return nil
}

// Features implements broker.Publisher.
func (p *Publisher) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// Close implements broker.Publisher.
func (p *Publisher) Close() error {
	p.conn.Close()
	return nil
}
