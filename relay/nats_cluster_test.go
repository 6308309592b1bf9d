package relay_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay"
)

// TestNATSClusterLeaderRestart drains a backlog into a 3-node JetStream cluster
// (embedded servers on loopback, the stream replicated 3 times) while the stream's
// leader node is stopped and started again: nothing is lost, each aggregate's events
// are in write order, and the stream stores each event once (Nats-Msg-Id).
func TestNATSClusterLeaderRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	servers, err := natsembed.StartCluster([]string{t.TempDir(), t.TempDir(), t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Stop()
		}
	})
	urls := make([]string, len(servers))
	for i, s := range servers {
		urls[i] = s.URL()
	}
	url := strings.Join(urls, ",")
	// A loaded machine makes the cluster's elections slow: the whole scenario has
	// three minutes, and reading the stream back a minute of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	const stream, aggs, perAgg = "ORDERS", 20, 60
	// The cluster elects its JetStream meta leader after it forms: retry until then.
	testenv.Wait(t, ctx, "the R3 stream created", func() bool {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		defer acancel()
		_, err = js.CreateStream(actx, jetstream.StreamConfig{Name: stream, Subjects: []string{"outbox.event.>"}, Replicas: 3})
		return err == nil
	})
	pub, err := natspub.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	want := produce(t, e, aggs, perAgg)
	r := startRelay(t, e, pub, &relay.Config{BatchSize: 50})

	testenv.Wait(t, ctx, "300 events published", func() bool { return r.Stats().Published >= 300 })
	info, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	leader := info.CachedInfo().Cluster.Leader
	var stopped *natsembed.Server
	for _, s := range servers {
		if s.Name() == leader {
			stopped = s
		}
	}
	if stopped == nil {
		t.Fatalf("stream leader %q is no member", leader)
	}
	before := r.Stats().Published
	stopped.Stop() // the stream elects another leader; publishes wait, then go on
	testenv.Wait(t, ctx, "publishing to go on under another stream leader", func() bool { return r.Stats().Published > before })
	if err := stopped.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Wait(t, ctx, "every event published", func() bool { return r.Stats().Published >= aggs*perAgg })
	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	defer rcancel()
	msgs, err := natstest.Read(rctx, url, stream, "outbox.event.order", aggs*perAgg)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, m := range msgs {
		got[m.Key] = append(got[m.Key], m.ID)
	}
	for agg, ids := range want {
		if !slices.Equal(got[agg], ids) {
			t.Fatalf("aggregate %s lost, duplicated or out of order:\n got %v\nwant %v", agg, got[agg], ids)
		}
	}
	if info, err := js.Stream(ctx, stream); err != nil || info.CachedInfo().State.Msgs != aggs*perAgg {
		t.Fatalf("the stream stores %d messages, want %d (%v)", info.CachedInfo().State.Msgs, aggs*perAgg, err)
	}
}
