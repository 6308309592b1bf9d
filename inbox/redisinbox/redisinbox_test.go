package redisinbox_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/redis"
	"github.com/outboxd/outbox/inbox/inboxtest"
	"github.com/outboxd/outbox/inbox/redisinbox"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEndToEnd: events added by the Redis publisher, one added twice and one failing
// its first handling, are applied once each; the failed one is read again from the
// group's pending entries.
func TestEndToEnd(t *testing.T) {
	url := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := redis.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	stream := testenv.UniqueName("inboxtest.")
	opts, _ := goredis.ParseURL(url)
	c := goredis.NewClient(opts)
	defer c.Close()
	defer c.Del(context.Background(), stream)
	e := func(id, agg string, seq int64) broker.Message {
		return broker.Message{ID: id, Topic: stream, Key: agg, EventType: "T", AggregateType: "order", AggregateID: agg, Seq: seq, Payload: []byte(`{}`)}
	}
	for _, r := range pub.Publish(ctx, []broker.Message{e("e1", "1", 1), e("e2", "1", 2), e("e2", "1", 2), e("e3", "2", 3)}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	env := inboxtest.New(t, "e3")
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- redisinbox.Consume(cctx, c, stream, "billing", "billing-1", env.IB, "billing", env.Handler, nil)
	}()
	env.Wait(t, "e1", "e2", "e3")
	// The acknowledgement follows the handler's commit: wait for it before stopping
	// (an entry stopped between the two is redelivered, and the inbox skips it).
	testenv.Wait(t, ctx, "no entry left pending", func() bool {
		n, err := c.XPending(ctx, stream, "billing").Result()
		return err == nil && n.Count == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
