package relayprom_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relayprom"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMetricsAfterKnownWorkload: 20 events, one of them too large for the broker, then
// a delayed one; the metrics say exactly that.
func TestMetricsAfterKnownWorkload(t *testing.T) {
	_, drv := testenv.Outbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, _ := drv.Store()
	reg := prometheus.NewRegistry()
	metrics, err := relayprom.New(reg, store)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := outbox.NewWriter(drv, nil)
	evs := make([]outbox.Event, 20)
	for i := range evs {
		evs[i] = outbox.Event{AggregateType: "order", AggregateID: "a", Type: "T", Payload: []byte(`{}`)}
	}
	evs[7] = outbox.Event{AggregateType: "order", AggregateID: "big", Type: "T", Payload: []byte(`{"pad":"` + strings.Repeat("x", 200) + `"}`)}
	later := outbox.Event{AggregateType: "order", AggregateID: "later", Type: "T", Payload: []byte(`{}`), NotBefore: time.Now().Add(time.Hour)}
	if err := w.Write(ctx, append(evs, later)...); err != nil {
		t.Fatal(err)
	}
	mem := memory.New(100)
	r, err := relay.New(store, mem, &relay.Config{Hooks: metrics, PollInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Start(ctx)
	testenv.Wait(t, ctx, "19 events published", func() bool { return r.Stats().Published >= 19 })
	if got := testutil.ToFloat64(metrics.PublishedCounter("outbox.event.order")); got != 19 {
		t.Errorf("published_total = %v, want 19", got)
	}
	if got := testutil.ToFloat64(metrics.FailedCounter("outbox.event.order", "permanent")); got != 1 {
		t.Errorf("failed_total{permanent} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(metrics.LeaderGauge()); got != 1 {
		t.Errorf("leader = %v, want 1", got)
	}
	want := `
# HELP outbox_dead_letters Events in the dead-letter table.
# TYPE outbox_dead_letters gauge
outbox_dead_letters 1
# HELP outbox_held_aggregates Aggregates whose events wait behind a dead letter.
# TYPE outbox_held_aggregates gauge
outbox_held_aggregates 1
# HELP outbox_unpublished_events Events not yet published.
# TYPE outbox_unpublished_events gauge
outbox_unpublished_events 1
`
	// The relay marks rows after the broker's answer: wait for the table to agree.
	var diff error
	testenv.WaitTell(t, ctx, "the table's gauges to agree", func() bool {
		diff = testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_dead_letters", "outbox_held_aggregates", "outbox_unpublished_events")
		return diff == nil
	}, func() string { return fmt.Sprint(diff) })
	if n := testutil.CollectAndCount(reg, "outbox_relay_commit_to_ack_seconds"); n != 1 {
		t.Errorf("latency histogram missing (%d)", n)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(metrics.LeaderGauge()); got != 0 {
		t.Errorf("leader after stop = %v, want 0", got)
	}
	// Every claim the store answered, empty ones too, is timed once.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var timed uint64
	for _, f := range families {
		if f.GetName() == "outbox_relay_claim_seconds" {
			timed = f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if claims := r.Stats().Claims; claims < 2 || timed != uint64(claims) {
		t.Errorf("claim_seconds counted %d claims, the relay %d", timed, claims)
	}
}
