// Package redisinbox consumes outbox events from a Redis stream through an inbox,
// in a consumer group: each entry is handled once in the consumer's transaction and
// XACKed only after that transaction committed. An entry whose handler failed stays
// pending and is read again.
package redisinbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxd/outbox/broker/redis"
	"github.com/outboxd/outbox/inbox"
)

// Message reads the relay's fields (id, key, type, headers, payload) from an entry.
func Message(x goredis.XMessage) inbox.Message {
	str := func(k string) string { s, _ := x.Values[k].(string); return s }
	var h map[string]string
	_ = json.Unmarshal([]byte(str(redis.FieldHeaders)), &h)
	m := inbox.FromHeaders(h, []byte(str(redis.FieldPayload)))
	if m.ID == "" {
		m.ID = str(redis.FieldID)
	}
	if m.AggregateID == "" {
		m.AggregateID = str(redis.FieldKey)
	}
	return m
}

// Consume reads stream as member consumer of group (created if missing) until ctx
// ends. Pending entries (a failed handler, a crash before XACK) are retried first.
// A failing entry stays pending and is read again after a growing pause; a permanent
// failure is logged and acknowledged (skipped). opts may be nil.
func Consume[TTx any](ctx context.Context, c goredis.UniversalClient, stream, group, consumer string, ib *inbox.Inbox[TTx],
	name string, fn func(ctx context.Context, tx TTx, m *inbox.Message) error, opts *inbox.ConsumeOptions) error {
	retry := inbox.NewRetrier(opts)
	failures := 0 // rounds in a row with a failure
	if err := c.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("redisinbox: create group: %w", err)
	}
	pending := true // first our own pending entries ("0"), then new ones (">")
	for ctx.Err() == nil {
		start := ">"
		if pending {
			start = "0"
		}
		res, err := c.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: group, Consumer: consumer, Streams: []string{stream, start},
			Count: 100, Block: 500 * time.Millisecond}).Result()
		if errors.Is(err, goredis.Nil) || ctx.Err() != nil {
			pending = false
			continue
		}
		if err != nil {
			return fmt.Errorf("redisinbox: read: %w", err)
		}
		failed := false
		var wait time.Duration
		for _, s := range res {
			for _, x := range s.Messages {
				m := Message(x)
				if _, err := ib.Handle(ctx, name, &m, func(ctx context.Context, tx TTx) error { return fn(ctx, tx, &m) }); err != nil {
					d, permanent := retry.Failed(name, &m, failures+1, err)
					if !permanent {
						failed = true // stays pending; read again from "0"
						wait = max(wait, d)
						continue
					}
				}
				_ = c.XAck(ctx, stream, group, x.ID).Err()
			}
		}
		// After a failure, go back to the pending entries (after a pause that grows);
		// when the pending list is drained, read new entries.
		if failed {
			failures++
			inbox.Sleep(ctx, wait)
		} else {
			failures = 0
		}
		pending = failed || (pending && len(res) > 0 && len(res[0].Messages) > 0)
	}
	return nil
}
