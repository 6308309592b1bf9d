package relayprom_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relayprom"
)

// TestLabelsFromRowBytes: a topic made of invalid UTF-8 (an aggregate type written by
// plain SQL) is counted, not a panic; thousands of topics make at most MaxTopics+1
// series.
func TestLabelsFromRowBytes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := relayprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	row := &outboxdriver.Row{CreatedAt: time.Now()}
	m.BatchPublished([]relay.Outcome{{Row: row, Topic: "outbox.event.\xff\xfe"}}, time.Millisecond)
	outcomes := make([]relay.Outcome, 0, 2000)
	for i := range 2000 {
		outcomes = append(outcomes, relay.Outcome{Row: row, Topic: fmt.Sprintf("outbox.event.t%d", i)})
	}
	m.BatchPublished(outcomes, time.Millisecond)
	if n := testutil.CollectAndCount(reg, "outbox_relay_published_total"); n > relayprom.MaxTopics+1 {
		t.Fatalf("%d series for 2001 topics, want at most %d", n, relayprom.MaxTopics+1)
	}
	if got := testutil.ToFloat64(m.PublishedCounter(relayprom.OtherTopic)); got < 1 {
		t.Fatalf("no events counted under %q", relayprom.OtherTopic)
	}
}

// TestLabelsShownSafely: a topic holding a right-to-left override or a C1 control
// reaches /metrics escaped (\u202e), as every other output shows it.
func TestLabelsShownSafely(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := relayprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	row := &outboxdriver.Row{CreatedAt: time.Now()}
	m.BatchPublished([]relay.Outcome{{Row: row, Topic: "outbox.event.evil\u202egnp\u009b"}}, time.Millisecond)
	if got := testutil.ToFloat64(m.PublishedCounter(`outbox.event.evil\u202egnp\u009b`)); got != 1 {
		t.Fatalf("the escaped topic label counts %v, want 1", got)
	}
}
