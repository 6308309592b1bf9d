package replay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/kafka"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/inbox/kafkainbox"
	"github.com/outboxd/outbox/inbox/natsinbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
	"github.com/outboxd/outbox/replay"
)

// TestRebuildFromReplay: a consumer's read model, dropped and rebuilt from a replay
// (inbox.Config.Reprocess takes the events it had already processed), equals the
// one it built live; the live consumer, without Reprocess, skips the replayed events
// as duplicates. On NATS JetStream and on Kafka (kfake).
func TestRebuildFromReplay(t *testing.T) {
	t.Parallel()
	t.Run("nats", func(t *testing.T) {
		url := natstest.URL(t)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		prefix := testenv.UniqueName("rebuild")
		stream := natstest.Stream(t, url, prefix)
		pub, err := natspub.Dial(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		rebuildScenario(t, pub, prefix+".${aggregatetype}", func(ctx context.Context, sub string, ib *inbox.Inbox[pgx.Tx], fn func(context.Context, pgx.Tx, *inbox.Message) error) error {
			cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: sub, AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				return err
			}
			return natsinbox.Consume(ctx, cons, ib, "readmodel", fn, nil)
		})
	})
	t.Run("kafka", func(t *testing.T) {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "outbox.event.order"))
		if err != nil {
			t.Fatal(err)
		}
		defer cluster.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		pub, err := kafka.Dial(ctx, "kafka://"+cluster.ListenAddrs()[0], nil)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		rebuildScenario(t, pub, broker.TopicTemplateDefault, func(ctx context.Context, sub string, ib *inbox.Inbox[pgx.Tx], fn func(context.Context, pgx.Tx, *inbox.Message) error) error {
			cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(sub),
				kgo.ConsumeTopics("outbox.event.order"), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				return err
			}
			defer cl.Close()
			return kafkainbox.Consume(ctx, cl, ib, "readmodel", fn, nil)
		})
	})
}

// consumeFunc consumes from the broker as subscriber sub (a durable consumer, a
// consumer group) through ib, as the consumer "readmodel", until ctx ends.
type consumeFunc func(ctx context.Context, sub string, ib *inbox.Inbox[pgx.Tx], fn func(context.Context, pgx.Tx, *inbox.Message) error) error

func rebuildScenario(t *testing.T, pub broker.Publisher, topic string, consume consumeFunc) {
	t.Helper()
	e := newEnv(t)
	ctx := context.Background()
	tmpl, err := broker.ParseTemplate(topic)
	if err != nil {
		t.Fatal(err)
	}
	store, err := e.drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	want := e.write(t, "order", 4, 15)
	relaytest.Start(t, store, pub, &relay.Config{TopicTemplate: topic, PollInterval: 20 * time.Millisecond})
	testenv.Wait(t, ctx, "every event published and marked", func() bool {
		h, err := replay.New(e.pool, e.table).History(ctx)
		return err == nil && h.Events == 60
	})

	// The consumer's tables: its inbox, its version guard, and its read model.
	inboxTable := testenv.UniqueName("inbox_")
	ib, err := inbox.NewPgx(e.pool, &inbox.Config{Table: inboxTable, VersionGuard: true})
	if err != nil {
		t.Fatal(err)
	}
	rebuilder, err := inbox.NewPgx(e.pool, &inbox.Config{Table: inboxTable, VersionGuard: true, Reprocess: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	model := e.table.Schema + ".model"
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+model+` (aggregate text PRIMARY KEY, total bigint NOT NULL, applied int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// Signs: one message per aggregate, sent after the replay on the aggregate's key.
	// A consumer that has handled a sign has handled every message of its aggregate
	// before it (per-key order), replayed ones included: it is how the test knows
	// the consumer is done, instead of sleeping.
	var signs atomic.Int64
	sendSigns := func() {
		t.Helper()
		msgs := make([]broker.Message, 0, len(want))
		for agg := range want {
			msgs = append(msgs, broker.Message{ID: uuid.Must(uuid.NewV7()).String(), Topic: tmpl.Execute(broker.TopicFields{AggregateType: "order", Type: "Sign"}, nil),
				Key: agg, EventType: "Sign", AggregateType: "order", AggregateID: agg, Payload: []byte(`{}`)})
		}
		for _, r := range pub.Publish(ctx, msgs) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	apply := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.Type == "Sign" {
			signs.Add(1)
			return nil
		}
		var p struct{ N int64 }
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return inbox.Permanent(err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+model+` VALUES ($1, $2, 1)
ON CONFLICT (aggregate) DO UPDATE SET total = `+model+`.total + $2, applied = `+model+`.applied + 1`, m.AggregateID, p.N)
		return err
	}
	snapshot := func() map[string][2]int64 {
		rows, err := e.pool.Query(ctx, `SELECT aggregate, total, applied FROM `+model)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string][2]int64{}
		for rows.Next() {
			var a string
			var total, applied int64
			if err := rows.Scan(&a, &total, &applied); err != nil {
				t.Fatal(err)
			}
			out[a] = [2]int64{total, applied}
		}
		return out
	}
	applied := func() int64 {
		var n int64
		for _, v := range snapshot() {
			n += v[1]
		}
		return n
	}
	run := func(name string, ib *inbox.Inbox[pgx.Tx]) (stop func()) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			err := consume(cctx, name, ib, apply)
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("consumer %s: %v", name, err)
			}
			done <- nil
		}()
		return func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}
	}

	// Live.
	stop := run("live", ib)
	testenv.Wait(t, ctx, "the live read model", func() bool { return applied() == 60 })
	live := snapshot()
	if len(live) != len(want) {
		t.Fatalf("live model: %v", live)
	}
	// The replay reaches the live consumer too: without Reprocess it skips every
	// event as a duplicate.
	if res, err := replay.New(e.pool, e.table).Run(ctx, pub, &replay.Config{Name: "rebuild", Topic: tmpl}); err != nil || res.Sent != 60 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	sendSigns() // a replayed event applied again would show before them
	testenv.Wait(t, ctx, "the live consumer past the signs", func() bool { return signs.Load() == int64(len(want)) })
	stop()
	if got := snapshot(); fmt.Sprint(got) != fmt.Sprint(live) {
		t.Fatalf("the live consumer applied replayed events: %v, was %v", got, live)
	}

	// Rebuild: the model dropped, a consumer with Reprocess reads from the start;
	// the first deliveries are duplicates, the replayed ones are applied.
	if _, err := e.pool.Exec(ctx, `TRUNCATE `+model); err != nil {
		t.Fatal(err)
	}
	stop = run("rebuilder", rebuilder)
	testenv.Wait(t, ctx, "the rebuilt read model", func() bool { return applied() >= 60 })
	sendSigns() // the first signs are duplicates to the rebuilder: only these run
	testenv.Wait(t, ctx, "the rebuilder past the new signs", func() bool { return signs.Load() == 2*int64(len(want)) })
	stop()
	if got := snapshot(); fmt.Sprint(got) != fmt.Sprint(live) {
		t.Fatalf("rebuilt model %v, want the live one %v", got, live)
	}
}
