// Package relayprom exposes the relay's metrics to Prometheus: it implements
// relay.Hooks for what the relay does, and collects the table's backlog from the
// store at scrape time.
//
// Metrics:
//
//	outbox_relay_published_total{topic}            events the broker acknowledged (at most MaxTopics topics)
//	outbox_relay_failed_total{topic,reason}        failed publishes: unavailable, refused, permanent, held_back, deferred
//	outbox_relay_commit_to_ack_seconds             write (created_at) to broker acknowledgement
//	outbox_relay_batch_size                        rows per published batch
//	outbox_relay_publish_seconds                   time the broker took for a batch
//	outbox_relay_claim_seconds                     time the store took to claim a batch (grows until vacuum, docs/operations.md)
//	outbox_relay_leader                            1 while this relay is the active one (or an active group member)
//	outbox_relay_partitions_owned                  partitions this group member owns
//	outbox_unpublished_events                      backlog (from the table, at scrape)
//	outbox_oldest_unpublished_age_seconds          age of the oldest unpublished event
//	outbox_failing_events                          unpublished events with failed attempts
//	outbox_dead_letters                            events in the dead-letter table
//	outbox_held_aggregates                         aggregates waiting behind a dead letter
//	outbox_group_relays                            relays of the group (at scrape)
//	outbox_group_partitions                        partitions of the table (group mode)
//	outbox_partition_unpublished_events{partition} backlog per partition (group mode)
//	outbox_cdc_slot_lag_bytes{slot}                CDC: WAL written since the slot's confirmed position
//	outbox_cdc_slot_retained_wal_bytes{slot}       CDC: WAL the slot keeps on disk
//	outbox_cdc_slot_safe_wal_bytes{slot}           CDC: WAL left before max_slot_wal_keep_size invalidates it
//	outbox_cdc_slot_ok{slot,wal_status}            CDC: 0 when the slot is lost
//	outbox_relay_table_retired{table}              a table a relay of many let go on purpose (RetiredTables)
package relayprom

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/safetext"
	"github.com/outboxd/outbox/relay"
)

// MaxTopics is how many distinct topic label values the metrics keep; later topics
// are counted under OtherTopic.
const MaxTopics = 500

// OtherTopic is the topic label of every topic past MaxTopics.
const OtherTopic = "_other"

// Metrics is a relay.Hooks and a prometheus.Collector. Build it with New.
type Metrics struct {
	mu     sync.Mutex
	topics map[string]struct{} // topic label values in use

	published   *prometheus.CounterVec
	failed      *prometheus.CounterVec
	latency     prometheus.Histogram
	batchSize   prometheus.Histogram
	publishTime prometheus.Histogram
	claimTime   prometheus.Histogram
	leader      prometheus.Gauge
	partitions  prometheus.Gauge
	store       StatusReader

	unpublished, oldest, failing, dead, held *prometheus.Desc
	slotRetained, slotLag, slotSafe, slotOK  *prometheus.Desc
	groupRelays, groupPartitions             *prometheus.Desc
	partitionBacklog                         *prometheus.Desc
	scrapeErrors                             prometheus.Counter
}

var (
	_ relay.Hooks      = (*Metrics)(nil)
	_ relay.GroupHooks = (*Metrics)(nil)
	_ relay.ClaimHooks = (*Metrics)(nil)
)

// New registers the metrics on reg. store, when not nil, is read at every scrape for
// the backlog gauges (with a 5 s timeout): give it a StatusCache, so scrapes cannot
// load the database.
func New(reg prometheus.Registerer, store StatusReader) (*Metrics, error) {
	m := &Metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_published_total",
			Help: "Events the broker acknowledged."}, []string{"topic"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_failed_total",
			Help: "Failed publishes by reason: unavailable, refused, permanent, held_back, deferred."}, []string{"topic", "reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_relay_commit_to_ack_seconds",
			Help: "Time from the event's write to the broker's acknowledgement.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_relay_batch_size",
			Help: "Rows per published batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 8)}),
		publishTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_relay_publish_seconds",
			Help: "Time the broker took to answer for a batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		claimTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_relay_claim_seconds",
			Help: "Time the store took to claim a batch (on PostgreSQL its reads and row locks).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_leader", Help: "1 while this relay is the active one (in a group: an active member)."}),
		partitions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_partitions_owned",
			Help: "Partitions this relay owns (group mode; 0 otherwise)."}),
		scrapeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_status_scrape_errors_total",
			Help: "Failed reads of the outbox table's status."}),
		store:       store,
		topics:      map[string]struct{}{},
		unpublished: prometheus.NewDesc("outbox_unpublished_events", "Events not yet published.", nil, nil),
		oldest:      prometheus.NewDesc("outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished event.", nil, nil),
		failing:     prometheus.NewDesc("outbox_failing_events", "Unpublished events with at least one failed attempt.", nil, nil),
		dead:        prometheus.NewDesc("outbox_dead_letters", "Events in the dead-letter table.", nil, nil),
		held:        prometheus.NewDesc("outbox_held_aggregates", "Aggregates whose events wait behind a dead letter.", nil, nil),
		slotRetained: prometheus.NewDesc("outbox_cdc_slot_retained_wal_bytes",
			"WAL the CDC relay's replication slot keeps on disk (from its restart position).", []string{"slot"}, nil),
		slotLag: prometheus.NewDesc("outbox_cdc_slot_lag_bytes",
			"WAL written since the slot's confirmed position: the CDC relay's backlog.", []string{"slot"}, nil),
		slotSafe: prometheus.NewDesc("outbox_cdc_slot_safe_wal_bytes",
			"WAL that may still be written before PostgreSQL invalidates the slot (max_slot_wal_keep_size); -1: unlimited.", []string{"slot"}, nil),
		groupRelays:     prometheus.NewDesc("outbox_group_relays", "Relays of the group seen by the database (group mode).", nil, nil),
		groupPartitions: prometheus.NewDesc("outbox_group_partitions", "Partitions of the table (group mode).", nil, nil),
		partitionBacklog: prometheus.NewDesc("outbox_partition_unpublished_events",
			"Unpublished events per partition (group mode).", []string{"partition"}, nil),
		slotOK: prometheus.NewDesc("outbox_cdc_slot_ok",
			"1 while the slot exists and its wal_status is not lost; 0: the slot is lost (see docs/cdc.md).", []string{"slot", "wal_status"}, nil),
	}
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.failed, m.latency, m.batchSize, m.publishTime, m.claimTime, m.leader, m.partitions, m.scrapeErrors, m}
}

// Unregister removes the metrics from reg, the registerer New was given: for a relay
// that stops while its process goes on (a table gone from a many-table relay).
func (m *Metrics) Unregister(reg prometheus.Registerer) {
	for _, c := range m.collectors() {
		reg.Unregister(c)
	}
}

// Claimed implements relay.ClaimHooks.
func (m *Metrics) Claimed(_ int, took time.Duration) { m.claimTime.Observe(took.Seconds()) }

// BatchPublished implements relay.Hooks. Counts are summed per topic first: the
// label lookup is the costly part, and a batch is mostly one or a few topics.
func (m *Metrics) BatchPublished(outcomes []relay.Outcome, publishTime time.Duration) {
	now := time.Now()
	m.batchSize.Observe(float64(len(outcomes)))
	m.publishTime.Observe(publishTime.Seconds())
	type key struct{ topic, reason string }
	counts := map[key]int{}
	for _, o := range outcomes {
		reason := ""
		switch {
		case o.Err == nil:
			m.latency.Observe(now.Sub(o.Row.CreatedAt).Seconds())
		case broker.IsUnavailable(o.Err):
			reason = "unavailable"
		case broker.IsHeldBack(o.Err):
			reason = "held_back"
		case broker.IsDeferred(o.Err):
			reason = "deferred"
		case broker.IsPermanent(o.Err):
			reason = "permanent"
		default:
			reason = "refused"
		}
		counts[key{o.Topic, reason}]++
	}
	for k, n := range counts {
		topic := m.topicLabel(k.topic)
		if k.reason == "" {
			m.published.WithLabelValues(topic).Add(float64(n))
		} else {
			m.failed.WithLabelValues(topic, k.reason).Add(float64(n))
		}
	}
}

// topicLabel is the label value for a topic: valid UTF-8 (WithLabelValues panics on
// anything else, and a topic comes from a row's bytes) with the runes that act on a
// display escaped (a dashboard or a terminal shows them: safetext), and one of at most MaxTopics
// values: past that, every new topic is counted as OtherTopic, so a table with
// thousands of aggregate types cannot make thousands of series.
func (m *Metrics) topicLabel(topic string) string {
	topic = safetext.Display(topic)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.topics[topic]; ok {
		return topic
	}
	if len(m.topics) >= MaxTopics {
		return OtherTopic
	}
	m.topics[topic] = struct{}{}
	return topic
}

// PartitionsOwned implements relay.GroupHooks.
func (m *Metrics) PartitionsOwned(n int) { m.partitions.Set(float64(n)) }

// LeaderChanged implements relay.Hooks.
func (m *Metrics) LeaderChanged(leader bool) {
	if leader {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

// Describe implements prometheus.Collector (the status gauges).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.unpublished, m.oldest, m.failing, m.dead, m.held, m.slotRetained, m.slotLag, m.slotSafe, m.slotOK, m.groupRelays, m.groupPartitions, m.partitionBacklog} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it reads the table's status.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	if m.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := m.store.Status(ctx)
	if err != nil {
		m.scrapeErrors.Inc()
		return
	}
	ch <- prometheus.MustNewConstMetric(m.unpublished, prometheus.GaugeValue, float64(st.Unpublished))
	ch <- prometheus.MustNewConstMetric(m.oldest, prometheus.GaugeValue, st.OldestAge.Seconds())
	ch <- prometheus.MustNewConstMetric(m.failing, prometheus.GaugeValue, float64(st.Failing))
	ch <- prometheus.MustNewConstMetric(m.dead, prometheus.GaugeValue, float64(st.Dead))
	ch <- prometheus.MustNewConstMetric(m.held, prometheus.GaugeValue, float64(st.HeldKeys))
	if len(st.Relays) > 0 {
		ch <- prometheus.MustNewConstMetric(m.groupRelays, prometheus.GaugeValue, float64(len(st.Relays)))
		ch <- prometheus.MustNewConstMetric(m.groupPartitions, prometheus.GaugeValue, float64(len(st.PartitionBacklog)))
		for p, n := range st.PartitionBacklog {
			ch <- prometheus.MustNewConstMetric(m.partitionBacklog, prometheus.GaugeValue, float64(n), strconv.Itoa(p))
		}
	}
	for _, sl := range st.Slots {
		ok := 0.0
		if sl.Exists && sl.WALStatus != "lost" {
			ok = 1
		}
		ch <- prometheus.MustNewConstMetric(m.slotOK, prometheus.GaugeValue, ok, sl.Name, sl.WALStatus)
		ch <- prometheus.MustNewConstMetric(m.slotRetained, prometheus.GaugeValue, float64(sl.RetainedBytes), sl.Name)
		ch <- prometheus.MustNewConstMetric(m.slotLag, prometheus.GaugeValue, float64(sl.LagBytes), sl.Name)
		ch <- prometheus.MustNewConstMetric(m.slotSafe, prometheus.GaugeValue, float64(sl.SafeBytes), sl.Name)
	}
}

// PublishedCounter is the published_total series of topic (for tests and dashboards).
func (m *Metrics) PublishedCounter(topic string) prometheus.Counter {
	return m.published.WithLabelValues(topic)
}

// FailedCounter is the failed_total series of topic and reason.
func (m *Metrics) FailedCounter(topic, reason string) prometheus.Counter {
	return m.failed.WithLabelValues(topic, reason)
}

// LeaderGauge is the leader gauge.
func (m *Metrics) LeaderGauge() prometheus.Gauge { return m.leader }
