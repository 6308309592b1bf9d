package relay_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay"
)

// TestKafkaClusterFailover drains a backlog into a 3-broker Kafka (kfake: no Kafka
// broker runs on our machines) while partition leaders move, every leader is
// re-elected and a broker is removed: nothing is lost, and each aggregate's events
// are in write order in its partition.
func TestKafkaClusterFailover(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const topic, aggs, perAgg = "outbox.event.order", 30, 60
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx := waitCtx(t)
	pub, err := kafka.Dial(ctx, "kafka://"+strings.Join(cluster.ListenAddrs(), ","), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	want := produce(t, e, aggs, perAgg) // the backlog, ids per aggregate in write order
	r := startRelay(t, e, pub, &relay.Config{BatchSize: 50})

	// The disruptions, at points of the drain.
	for _, step := range []struct {
		after int64
		do    func() error
	}{
		{300, func() error { return cluster.MoveTopicPartition(topic, 0, cluster.LeaderFor(topic, 1)) }},
		{700, func() error { cluster.ShufflePartitionLeaders(); return nil }},
		{1100, func() error { return cluster.RemoveNode(cluster.LeaderFor(topic, 2)) }},
	} {
		testenv.Wait(t, ctx, "the step's point of the drain", func() bool { return r.Stats().Published >= step.after })
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Wait(t, ctx, "every event published", func() bool { return r.Stats().Published >= aggs*perAgg })

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string][]string{} // ids per key, in partition order
	seen, dups := map[string]bool{}, 0
	for len(seen) < aggs*perAgg && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		cl.PollFetches(pctx).EachRecord(func(rec *kgo.Record) {
			var id string
			for _, h := range rec.Headers {
				if h.Key == broker.HeaderID {
					id = string(h.Value)
				}
			}
			if seen[id] {
				dups++
				return
			}
			seen[id] = true
			got[string(rec.Key)] = append(got[string(rec.Key)], id)
		})
		cancel()
	}
	if len(seen) != aggs*perAgg {
		t.Fatalf("%d of %d events in the topic", len(seen), aggs*perAgg)
	}
	for agg, ids := range want {
		if !slices.Equal(got[agg], ids) {
			t.Fatalf("aggregate %s out of order or incomplete:\n got %v\nwant %v", agg, got[agg], ids)
		}
	}
	t.Logf("%d events, %d duplicates (at least once), order kept per aggregate", len(seen), dups)
}
