// Package redis publishes outbox events to Redis Streams: one XADD per event to the
// stream named by its topic, with the fields id, key, type, headers (a JSON object of
// every wire-format header) and payload. A batch goes out as one pipeline, in order.
//
// Redis has no dedup: consumers dedup by the id field (the inbox does).
package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"unicode/utf8"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxd/outbox/broker"
)

// Config configures a Publisher. The zero value is valid.
type Config struct {
	// MaxLen, if positive, trims each stream to about this many entries (MAXLEN ~).
	MaxLen int64
	// MaxMessageBytes, if positive, refuses larger payloads before sending them.
	MaxMessageBytes int
}

// Publisher adds events to streams. Build it with New or Dial.
type Publisher struct {
	c   goredis.UniversalClient
	cfg Config
	own bool
}

// New returns a publisher on a client the caller built (and closes).
func New(c goredis.UniversalClient, cfg *Config) (*Publisher, error) {
	if c == nil {
		return nil, errors.New("redis publisher: client is nil")
	}
	p := &Publisher{c: c}
	if cfg != nil {
		p.cfg = *cfg
	}
	return p, nil
}

// Dial connects to a redis:// or rediss:// URL and checks the server answers.
func Dial(ctx context.Context, url string, cfg *Config) (*Publisher, error) {
	opts, err := goredis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	c := goredis.NewClient(opts)
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("connect to Redis at %s: %w", opts.Addr, err)
	}
	p, _ := New(c, cfg)
	p.own = true
	return p, nil
}

var _ broker.Publisher = (*Publisher)(nil)

// Publish implements broker.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	if len(msgs) == 0 {
		return res
	}
	var hold broker.KeyHold
	cmds := make([]*goredis.StringCmd, len(msgs))
	pipe := p.c.Pipeline()
	for i := range msgs {
		m := &msgs[i]
		if res[i].Err = hold.Admit(m, len(m.Payload), p.cfg.MaxMessageBytes); res[i].Err != nil {
			continue
		}
		h := make(map[string]string, m.HeaderCount())
		valid := true
		m.EachHeader(func(k, v string) {
			h[k] = v
			valid = valid && utf8.ValidString(k) && utf8.ValidString(v)
		})
		if !valid {
			// JSON would replace the bad bytes: refuse rather than alter the header.
			res[i].Err = broker.Permanent(errors.New("a header holds invalid UTF-8, which the JSON headers field cannot carry"))
			hold.Refuse(m.Key, res[i].Err)
			continue
		}
		headers, _ := json.Marshal(h)
		args := &goredis.XAddArgs{
			Stream: m.Topic,
			Values: []any{"id", m.ID, "key", m.Key, "type", m.EventType, "headers", headers, "payload", m.Payload},
		}
		if p.cfg.MaxLen > 0 {
			args.MaxLen, args.Approx = p.cfg.MaxLen, true
		}
		cmds[i] = pipe.XAdd(ctx, args)
	}
	_, err := pipe.Exec(ctx)
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if cerr := c.Err(); cerr != nil {
			res[i].Err = classify(ctx, cerr)
		} else if err != nil && c.Val() == "" {
			res[i].Err = classify(ctx, err)
		}
	}
	return res
}

func classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var netErr net.Error
	msg := err.Error()
	switch {
	case errors.As(err, &netErr), errors.Is(err, goredis.ErrClosed),
		strings.HasPrefix(msg, "OOM"), strings.HasPrefix(msg, "LOADING"), strings.HasPrefix(msg, "BUSY"),
		strings.HasPrefix(msg, "MASTERDOWN"), strings.HasPrefix(msg, "READONLY"), strings.HasPrefix(msg, "TRYAGAIN"),
		strings.Contains(msg, "connection refused"), strings.Contains(msg, "EOF"):
		return broker.Unavailable(err)
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return broker.Permanent(err)
	}
	return err
}

// Features implements broker.Publisher.
func (p *Publisher) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// Close implements broker.Publisher.
func (p *Publisher) Close() error {
	if p.own {
		return p.c.Close()
	}
	return nil
}
