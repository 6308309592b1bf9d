package testenv

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

// QuietLogger drops everything below errors+4 (nothing the relay logs), unless
// TEST_DEBUG is set: then it logs everything to stderr.
func QuietLogger() *slog.Logger {
	if os.Getenv("TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// StartRelay starts a relay on store and pub with test-speed defaults (a quiet
// logger, backoff 20–200 ms, standbys retrying every 50 ms), stopped when the test
// ends.
func StartRelay(t testing.TB, store outboxdriver.Source, pub broker.Publisher, cfg *relay.Config) *relay.Relay {
	t.Helper()
	if cfg == nil {
		cfg = &relay.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = QuietLogger()
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
