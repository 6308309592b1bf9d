package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

// benchDrain writes a backlog of b.N events and measures how fast a relay drains it.
func benchDrain(b *testing.B, pub func(b *testing.B) broker.Publisher, cfg relay.Config) {
	e := setupB(b)
	ctx := context.Background()
	pad := strings.Repeat("x", 150)
	for i := 0; i < b.N; i += 1000 {
		evs := make([]outbox.Event, 0, 1000)
		for j := i; j < min(i+1000, b.N); j++ {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(j % 1000), Type: "T", Payload: []byte(`{"n":` + fmt.Sprint(j) + `,"pad":"` + pad + `"}`)})
		}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return e.w.WriteTx(ctx, tx, evs...) }); err != nil {
			b.Fatal(err)
		}
	}
	cfg.Logger = quietLogger()
	if os.Getenv("BENCH_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := relay.New(e.store, pub(b), &cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	_ = r.Start(ctx)
	for r.Stats().Published < int64(b.N) {
		time.Sleep(2 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	_ = r.Stop(ctx)
}

func BenchmarkDrainMemory(b *testing.B) {
	benchDrain(b, func(*testing.B) broker.Publisher { return memory.New(0) }, relay.Config{})
}

func BenchmarkDrainNATS(b *testing.B) {
	benchDrain(b, func(b *testing.B) broker.Publisher {
		url := natstest.URL(b)
		prefix := testenv.UniqueName("bench")
		nc, _ := nats.Connect(url)
		b.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: prefix, Subjects: []string{"outbox.event.>"}}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = js.DeleteStream(ctx, prefix) })
		p, err := natspub.Dial(ctx, url, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.Close() })
		return p
	}, relay.Config{})
}

func BenchmarkDrainMemoryDelete(b *testing.B) {
	benchDrain(b, func(*testing.B) broker.Publisher { return memory.New(0) }, relay.Config{Completion: outboxdriver.CompleteDelete})
}

// BenchmarkPoisonNeighbours measures what a poison event costs the other aggregates:
// the median write-to-ack latency of healthy aggregates normally, and while one
// aggregate's event is refused until it goes to the dead letters. A ratio near 1 is
// the goal (docs/benchmarks.md); TestPoisonEvent checks only that they keep flowing.
func BenchmarkPoisonNeighbours(b *testing.B) {
	for i := 0; i < b.N; i++ {
		e := setupB(b)
		mem := memory.New(0)
		obs := observe(mem)
		r, err := relay.New(e.store, obs, &relay.Config{BatchSize: 100, PollInterval: 10 * time.Millisecond,
			MaxAttempts: 4, RetryMin: 30 * time.Millisecond, RetryMax: 60 * time.Millisecond, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = r.Start(ctx)
		sw := &steadyWriter{written: map[string]time.Time{}}
		stop, done := make(chan struct{}), make(chan struct{})
		go sw.run(b, e, stop, done)
		start := time.Now()
		time.Sleep(700 * time.Millisecond)
		poisonStart := time.Now()
		mem.Refuse("poison", false)
		if err := e.w.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "poison", Type: "Bad", Payload: []byte(`{}`)}); err != nil {
			b.Fatal(err)
		}
		for r.Stats().Dead == 0 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		poisonEnd := time.Now()
		close(stop)
		<-done
		sw.waitAcked(b, ctx, obs)
		normal := sw.medianLatency(b, obs, start.Add(200*time.Millisecond), poisonStart)
		during := sw.medianLatency(b, obs, poisonStart, poisonEnd)
		_ = r.Stop(context.Background())
		cancel()
		b.ReportMetric(float64(normal.Microseconds())/1000, "normal-p50-ms")
		b.ReportMetric(float64(during.Microseconds())/1000, "poison-p50-ms")
	}
}
