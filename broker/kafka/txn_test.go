package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/testenv"
)

// readIDs consumes topic from the start with the given isolation level until
// ctx ends or n records came, and returns their id headers in order.
func readIDs(ctx context.Context, addrs []string, topic string, n int, level kgo.IsolationLevel) []string {
	c, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(level))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	var ids []string
	for len(ids) < n && ctx.Err() == nil {
		c.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == broker.HeaderID {
					ids = append(ids, string(h.Value))
				}
			}
		})
	}
	return ids
}

// noMore fails if a read_committed consumer sees more than n records on topic within
// a second (a late duplicate; none can be missed that the test was meant to see,
// since the producer is done).
func noMore(t *testing.T, addrs []string, topic string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if got := readIDs(ctx, addrs, topic, n+1, kgo.ReadCommitted()); len(got) > n {
		t.Fatalf("read_committed saw %d records on %s, want %d", len(got), topic, n)
	}
}

func dialTx(t *testing.T, addr, id string, cfg *kafka.TxConfig) *kafka.TxPublisher {
	t.Helper()
	if cfg == nil {
		cfg = &kafka.TxConfig{}
	}
	cfg.TransactionalID = id
	p, err := kafka.DialTransactional("kafka://"+addr, cfg, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func resume(t *testing.T, p *kafka.TxPublisher) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids, err := p.Resume(ctx)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	return ids
}

// resuming drives a TxPublisher as the relay does: resumed before it publishes, and
// again after a batch failed with ErrFenced.
type resuming struct{ *kafka.TxPublisher }

func (r resuming) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := r.TxPublisher.Publish(ctx, msgs)
	for _, x := range res {
		if broker.IsFenced(x.Err) {
			_, _ = r.Resume(ctx)
			break
		}
	}
	return res
}

func txHarness(t *testing.T, addrs func() []string, restart func(*testing.T)) *brokertest.Harness {
	t.Helper()
	pub := dialTx(t, addrs()[0], testenv.UniqueName("tx"), &kafka.TxConfig{Config: kafka.Config{MaxMessageBytes: 4096}})
	resume(t, pub)
	return &brokertest.Harness{
		CloudEvents: cloudevents.Kafka,
		Publisher:   resuming{pub},
		Topic:       func(*testing.T) string { return testenv.UniqueName("outbox.event.t") },
		Read: func(ctx context.Context, topic string, n int) ([]broker.Message, error) {
			return readTopic(ctx, addrs(), topic, n, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		},
		Restart: restart,
	}
}

func TestTxConformance(t *testing.T) { conformance(t, txHarness) }

func TestTxConformanceRestart(t *testing.T) { conformanceRestart(t, txHarness) }

func events(topic string, n int) []broker.Message {
	out := make([]broker.Message, n)
	for i := range out {
		out[i] = broker.Message{ID: uuid.NewString(), Topic: topic, Key: fmt.Sprintf("k%d", i%3), Payload: []byte(`{}`)}
	}
	return out
}

func ids(msgs []broker.Message) []string {
	out := make([]string, len(msgs))
	for i := range msgs {
		out[i] = msgs[i].ID
	}
	return out
}

func requireOK(t *testing.T, res []broker.Result) {
	t.Helper()
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
}

// TestTxResumeFencesAndRecovers: a second owner with the same transactional id fences
// the first, and its resume returns what the first committed but never saw marked.
// Events it is handed again are answered without being sent; a read_committed
// consumer sees every event once.
func TestTxResumeFencesAndRecovers(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(3, "orders"))
	defer c.Close()
	addr := c.ListenAddrs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	first := dialTx(t, addr, "orders-relay", nil)
	if got := resume(t, first); len(got) != 0 {
		t.Fatalf("a new transactional id resumed with %d ids", len(got))
	}
	a, b, c2 := events("orders", 5), events("orders", 5), events("orders", 2)
	requireOK(t, first.Publish(ctx, a))
	first.Marked(ids(a[:2])) // the database marked only some of them
	requireOK(t, first.Publish(ctx, c2))

	second := dialTx(t, addr, "orders-relay", nil)
	got := resume(t, second)
	// The last progress record: what was not seen marked when it was written.
	if want := append(ids(a[2:]), ids(c2)...); !sameSet(got, want) {
		t.Fatalf("resume returned %v, want the unmarked %v", got, want)
	}
	// The first owner is fenced by Kafka: its batch is refused, and says so.
	res := first.Publish(ctx, b)
	for i, r := range res {
		if !broker.IsFenced(r.Err) || !broker.IsUnavailable(r.Err) {
			t.Fatalf("a fenced owner's message %d: err = %v, want ErrFenced (unavailable)", i, r.Err)
		}
	}
	// The new owner is handed the unmarked events again with new ones: only the new
	// ones are sent.
	requireOK(t, second.Publish(ctx, append(a[2:], b...)))
	want := append(append(ids(a), ids(c2)...), ids(b)...)
	if got := readIDs(ctx, c.ListenAddrs(), "orders", len(want), kgo.ReadCommitted()); !sameSet(got, want) {
		t.Fatalf("read_committed consumer saw %d ids %v, want each of %d once", len(got), got, len(want))
	}
	noMore(t, c.ListenAddrs(), "orders", len(want))
}

// TestTxUnits: each unit (a group's lease partition) is a transactional id of its own,
// ID.name: resuming one unit fences that unit's earlier owner only, and returns that
// unit's unmarked ids only.
func TestTxUnits(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(3, "orders"))
	defer c.Close()
	addr := c.ListenAddrs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	unit := func(p *kafka.TxPublisher, name string) broker.Ledger {
		t.Helper()
		u, err := p.Unit(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = u.Close() })
		if ids, err := u.Resume(ctx); err != nil || len(ids) != 0 {
			t.Fatalf("resume unit %s: %v, %v", name, ids, err)
		}
		return u
	}
	if _, err := dialTx(t, addr, "orders-relay", nil).Unit(""); err == nil {
		t.Fatal("a unit with no name was opened")
	}
	m1, m2 := dialTx(t, addr, "orders-relay", nil), dialTx(t, addr, "orders-relay", nil)
	p1, p2 := unit(m1, "p1"), unit(m1, "p2")
	a, b := events("orders", 3), events("orders", 3)
	requireOK(t, p1.Publish(ctx, a))
	requireOK(t, p2.Publish(ctx, b))

	// Another member takes p1: it resumes with p1's unmarked ids, and fences p1's owner.
	u, err := m2.Unit("p1")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if got, err := u.Resume(ctx); err != nil || !sameSet(got, ids(a)) {
		t.Fatalf("resume p1 elsewhere: %v, %v; want %v", got, err, ids(a))
	}
	for i, r := range p1.Publish(ctx, events("orders", 2)) {
		if !broker.IsFenced(r.Err) {
			t.Fatalf("the old owner of p1, message %d: err = %v, want ErrFenced", i, r.Err)
		}
	}
	// p2's owner is not touched.
	requireOK(t, p2.Publish(ctx, events("orders", 2)))
}

// TestTxAbortedBatch: a record the broker refuses aborts its transaction. It fails on
// its own; the others are held back (no attempt), and no read_committed consumer sees
// any of them, though a read_uncommitted one does: the check can fail.
func TestTxAbortedBatch(t *testing.T) {
	c := newCluster(t)
	defer c.Close()
	if err := c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "200"}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic("good", 1, nil); err != nil {
		t.Fatal(err)
	}
	addr := c.ListenAddrs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := dialTx(t, addr, "small-relay", nil)
	resume(t, p)
	msgs := events("good", 3)
	msgs[1].Topic, msgs[1].Payload = "small", make([]byte, 1000) // over the topic's limit, under the client's
	res := p.Publish(ctx, msgs)
	if res[1].Err == nil || !broker.IsPermanent(res[1].Err) {
		t.Fatalf("the oversized record: err = %v, want a permanent refusal", res[1].Err)
	}
	for _, i := range []int{0, 2} {
		if !broker.IsHeldBack(res[i].Err) {
			t.Fatalf("message %d in the aborted transaction: err = %v, want held back", i, res[i].Err)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if got := readIDs(short, c.ListenAddrs(), "good", 1, kgo.ReadCommitted()); len(got) != 0 {
		t.Fatalf("read_committed saw %v from an aborted transaction", got)
	}
	if got := readIDs(ctx, c.ListenAddrs(), "good", 1, kgo.ReadUncommitted()); len(got) == 0 {
		t.Fatal("read_uncommitted saw nothing: the aborted record never reached the log, so the check above proves nothing")
	}
	// The same batch without the poison commits.
	requireOK(t, p.Publish(ctx, []broker.Message{msgs[0], msgs[2]}))
	if got := readIDs(ctx, c.ListenAddrs(), "good", 2, kgo.ReadCommitted()); !sameSet(got, []string{msgs[0].ID, msgs[2].ID}) {
		t.Fatalf("read_committed saw %v", got)
	}
	noMore(t, c.ListenAddrs(), "good", 2)
}

// TestTxRefusedAtResume: a cluster without transactions, a user without the ACLs, and
// a progress topic that does not compact are each refused by Resume with one line.
func TestTxRefusedAtResume(t *testing.T) {
	noTxn := kversion.Stable()
	noTxn.SetMaxKeyVersion(int16(kmsg.InitProducerID), -1)
	for _, tc := range []struct {
		name string
		opts []kfake.Opt
		url  func(addr string) string
		want string
	}{
		{"no transactions", []kfake.Opt{kfake.MaxVersions(noTxn)}, nil, "does not run transactions"},
		{"no ACL on the transactional id", []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", "admin"),
			kfake.User("PLAIN", "app", "app",
				kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "*", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true},
				kfake.ACL{Resource: kmsg.ACLResourceTypeCluster, Name: "kafka-cluster", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true}),
			kfake.EnableACLs()},
			func(addr string) string { return "kafka://app:app@" + addr + "?sasl=plain" }, "transactional id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, tc.opts...)
			defer c.Close()
			url := "kafka://" + c.ListenAddrs()[0]
			if tc.url != nil {
				url = tc.url(c.ListenAddrs()[0])
			}
			p, err := kafka.DialTransactional(url, &kafka.TxConfig{TransactionalID: "r"})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_, err = p.Resume(ctx)
			t.Logf("refused: %v", err)
			if !errors.Is(err, kafka.ErrNoTransactions) || !broker.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("resume: %v; want ErrNoTransactions saying %q", err, tc.want)
			}
			res := p.Publish(ctx, events("t", 1))
			if !broker.IsFenced(res[0].Err) {
				t.Fatalf("publish after a failed resume: %v, want ErrFenced", res[0].Err)
			}
		})
	}
	t.Run("progress topic not compacted", func(t *testing.T) {
		c := newCluster(t)
		defer c.Close()
		if err := c.CreateTopic("progress", 1, map[string]string{"cleanup.policy": "delete"}); err != nil {
			t.Fatal(err)
		}
		p := dialTx(t, c.ListenAddrs()[0], "r", &kafka.TxConfig{ProgressTopic: "progress"})
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if _, err := p.Resume(ctx); !errors.Is(err, kafka.ErrProgressTopic) || !broker.IsPermanent(err) || !strings.Contains(err.Error(), "cleanup.policy=compact") {
			t.Fatalf("resume on a deleting progress topic: %v", err)
		}
	})
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		if m[x]--; m[x] < 0 {
			return false
		}
	}
	return true
}
