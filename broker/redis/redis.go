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

// The fields of a stream entry (consumers read them: inbox/redisinbox).
const (
	FieldID      = "id"      // the event id
	FieldKey     = "key"     // the ordering key (the aggregate id)
	FieldType    = "type"    // the event type
	FieldHeaders = "headers" // every header, as one JSON object
	FieldPayload = "payload" // the payload bytes
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
	args := make([]*goredis.XAddArgs, len(msgs))
	pipe := p.c.Pipeline()
	var execErr error
	return broker.Sequence(ctx, msgs, broker.Schedule{}, broker.Sender{
		Prepare: func(_ context.Context, i int) (err error) {
			args[i], err = p.prepare(&msgs[i])
			return err
		},
		Send: func(ctx context.Context, i int) (broker.Future, error) {
			return xadd{cmd: pipe.XAdd(ctx, args[i]), execErr: &execErr}, nil
		},
		// Each command carries its own outcome (a WRONGTYPE is one stream's); the
		// pipeline's error only fills in for a command that got no answer.
		Flush: func(ctx context.Context) error {
			_, execErr = pipe.Exec(ctx)
			return nil
		},
		Classify: func(err error) error { return classify(ctx, err) },
	})
}

// prepare refuses what the stream cannot take and renders the XADD.
func (p *Publisher) prepare(m *broker.Message) (*goredis.XAddArgs, error) {
	if p.cfg.MaxMessageBytes > 0 && len(m.Payload) > p.cfg.MaxMessageBytes {
		return nil, broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the limit of %d", len(m.Payload), p.cfg.MaxMessageBytes))
	}
	h := make(map[string]string, m.HeaderCount())
	valid := true
	m.EachHeader(func(k, v string) {
		h[k] = v
		valid = valid && utf8.ValidString(k) && utf8.ValidString(v)
	})
	if !valid {
		// JSON would replace the bad bytes: refuse rather than alter the header.
		return nil, broker.Permanent(errors.New("a header holds invalid UTF-8, which the JSON headers field cannot carry"))
	}
	headers, _ := json.Marshal(h)
	args := &goredis.XAddArgs{
		Stream: m.Topic,
		Values: []any{FieldID, m.ID, FieldKey, m.Key, FieldType, m.EventType, FieldHeaders, headers, FieldPayload, m.Payload},
	}
	if p.cfg.MaxLen > 0 {
		args.MaxLen, args.Approx = p.cfg.MaxLen, true
	}
	return args, nil
}

// xadd is one pipelined XADD's answer.
type xadd struct {
	cmd     *goredis.StringCmd
	execErr *error
}

// Wait implements broker.Future: the pipeline has run when it is called.
func (x xadd) Wait(context.Context) error {
	if err := x.cmd.Err(); err != nil {
		return err
	}
	if *x.execErr != nil && x.cmd.Val() == "" {
		return *x.execErr
	}
	return nil
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
