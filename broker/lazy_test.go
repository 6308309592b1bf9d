package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
)

// TestLazy: while its dial fails, a Lazy publisher answers every message
// ErrUnavailable (no attempt spent) and is not ready, and escapes and validates
// topics by the rules it was given; once a dial succeeds, it publishes through the
// dialed publisher.
func TestLazy(t *testing.T) {
	ctx := context.Background()
	down := errors.New("connection refused")
	mem := memory.New(0)
	up := false
	l := broker.NewLazy(func(context.Context) (broker.Publisher, error) {
		if !up {
			return nil, down
		}
		return mem, nil
	}, broker.Topics{Escape: strings.ToUpper, Validate: func(topic string) error {
		if topic == "" {
			return errors.New("empty topic")
		}
		return nil
	}})
	defer l.Close()
	msgs := []broker.Message{{ID: "1", Topic: "t", Key: "k", Payload: []byte("{}")}, {ID: "2", Topic: "t", Key: "k", Payload: []byte("{}")}}
	for i, res := range l.Publish(ctx, msgs) {
		if !broker.IsUnavailable(res.Err) || !errors.Is(res.Err, down) {
			t.Fatalf("message %d with the broker down: %v, want unavailable wrapping the dial's error", i, res.Err)
		}
	}
	if err := l.Ready(ctx); err == nil {
		t.Fatal("ready with the broker down")
	}
	if got := l.EscapeTopicToken("a.b"); got != "A.B" {
		t.Fatalf("escape: %q", got)
	}
	if l.ValidateTopic("") == nil || l.ValidateTopic("t") != nil {
		t.Fatal("validate: not the rule given")
	}
	up = true
	// The failed dial backs off (100 ms at first): retry until it is over.
	for l.Ready(ctx) != nil {
	}
	for i, res := range l.Publish(ctx, msgs) {
		if res.Err != nil {
			t.Fatalf("message %d with the broker up: %v", i, res.Err)
		}
	}
	if n := len(mem.Messages()); n != 2 {
		t.Fatalf("the broker holds %d messages, want 2", n)
	}
}
