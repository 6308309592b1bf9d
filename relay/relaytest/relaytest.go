// Package relaytest runs a relay for the length of a test, with test-speed defaults:
// the project's own tests use it, and so can a service's that embeds the relay.
package relaytest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

// Start starts a relay on store and pub with test-speed defaults (a quiet
// logger, backoff 20–200 ms, standbys retrying every 50 ms), stopped when the test
// ends.
func Start(t testing.TB, store outboxdriver.Source, pub broker.Publisher, cfg *relay.Config) *relay.Relay {
	t.Helper()
	if cfg == nil {
		cfg = &relay.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = testenv.QuietLogger()
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	if cfg.LeaderRetry == 0 {
		cfg.LeaderRetry = 50 * time.Millisecond
	}
	r, err := relay.New(store, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return r
}
