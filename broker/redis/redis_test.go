package redis_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/redis"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func read(ctx context.Context, c *goredis.Client, topic string, n int) ([]broker.Message, error) {
	for {
		entries, err := c.XRangeN(ctx, topic, "-", "+", int64(n)).Result()
		if err == nil && len(entries) >= n {
			out := make([]broker.Message, 0, n)
			for _, e := range entries {
				var h map[string]string
				_ = json.Unmarshal([]byte(e.Values["headers"].(string)), &h)
				out = append(out, broker.Message{ID: e.Values["id"].(string), Topic: topic, Key: e.Values["key"].(string),
					Payload: []byte(e.Values["payload"].(string)), Headers: h})
			}
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read %s: %w: %w", topic, err, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func harness(t *testing.T, url string, restart func(*testing.T)) *brokertest.Harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := redis.Dial(ctx, url, &redis.Config{MaxMessageBytes: 4096, MaxLen: 100000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	opts, _ := goredis.ParseURL(url)
	c := goredis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	var topics []string
	t.Cleanup(func() {
		if len(topics) > 0 {
			c.Del(context.Background(), topics...)
		}
	})
	return &brokertest.Harness{
		CloudEvents: cloudevents.Redis,
		Publisher:   pub,
		Topic: func(*testing.T) string {
			topics = append(topics, testenv.UniqueName("outbox.event.t"))
			return topics[len(topics)-1]
		},
		Read: func(ctx context.Context, topic string, n int) ([]broker.Message, error) {
			return read(ctx, c, topic, n)
		},
		Restart: restart,
	}
}

func TestConformanceMachine(t *testing.T) {
	url := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		return harness(t, url, nil)
	})
}

// TestConformanceClientKilled: the server closes the publisher's connections
// (CLIENT KILL); the client dials again and the publisher publishes on.
func TestConformanceClientKilled(t *testing.T) {
	url := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
	opts, _ := goredis.ParseURL(url)
	admin := goredis.NewClient(opts)
	defer admin.Close()
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		name := testenv.UniqueName("outboxkill")
		return harness(t, url+"?client_name="+name, func(t *testing.T) {
			t.Helper()
			// The connections of this harness only: other tests share the server.
			list, err := admin.ClientList(context.Background()).Result()
			if err != nil {
				t.Fatal(err)
			}
			killed := 0
			for _, line := range strings.Split(list, "\n") {
				if !strings.Contains(line, " name="+name+" ") {
					continue
				}
				for _, f := range strings.Fields(line) {
					if id, ok := strings.CutPrefix(f, "id="); ok {
						if err := admin.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err(); err == nil {
							killed++
						}
					}
				}
			}
			if killed == 0 {
				t.Fatalf("no connection named %s to kill in:\n%s", name, list)
			}
		})
	})
}

// TestConformanceRestart runs a redis-server of its own (append-only file, so data
// survives) that it stops and starts again.
func TestConformanceRestart(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Missing(t, "redis-server binary: %v", err)
	}
	port := strconv.Itoa(testenv.FreePort(t))
	dir := t.TempDir()
	var cmd *exec.Cmd
	start := func(t *testing.T) {
		t.Helper()
		cmd = exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--dir", dir, "--appendonly", "yes",
			"--appendfsync", "always", "--save", "")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + port})
		defer c.Close()
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		testenv.Wait(t, wctx, "redis-server answering", func() bool { return c.Ping(context.Background()).Err() == nil })
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	start(t)
	t.Cleanup(stop)
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		return harness(t, "redis://127.0.0.1:"+port+"/0", func(t *testing.T) {
			t.Helper()
			stop()
			start(t)
		})
	})
}

func TestWrongType(t *testing.T) {
	url := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
	ctx := context.Background()
	pub, err := redis.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	opts, _ := goredis.ParseURL(url)
	c := goredis.NewClient(opts)
	defer c.Close()
	key := testenv.UniqueName("notastream")
	c.Set(ctx, key, "x", time.Minute)
	defer c.Del(ctx, key)
	res := pub.Publish(ctx, []broker.Message{{ID: "a", Topic: key, Key: "k", Payload: []byte("{}")}})
	if !broker.IsPermanent(res[0].Err) {
		t.Fatalf("XADD to a string key: %v, want permanent", res[0].Err)
	}
	if _, err := redis.Dial(ctx, "redis://127.0.0.1:1/0", nil); err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
}
