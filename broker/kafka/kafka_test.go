package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/brokertest"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// There is no Kafka broker on our machines: kfake is an in-process Kafka that speaks
// the real protocol, so the publisher's client, partitioner and error handling run
// exactly as against a broker.
func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ReadTopic consumes the first n records of topic from the start.
func readTopic(ctx context.Context, addrs []string, topic string, n int, opts ...kgo.Opt) ([]broker.Message, error) {
	c, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var out []broker.Message
	for len(out) < n {
		fs := c.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, fmt.Errorf("have %d of %d: %w", len(out), n, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			out = append(out, broker.Message{ID: h["id"], Topic: r.Topic, Key: string(r.Key), Payload: r.Value, Headers: h})
		})
	}
	return out[:n], nil
}

func harness(t *testing.T, addrs func() []string, restart func(*testing.T)) *brokertest.Harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := kafka.Dial(ctx, "kafka://"+addrs()[0], &kafka.Config{MaxMessageBytes: 4096}, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return &brokertest.Harness{
		CloudEvents: cloudevents.Kafka,
		Publisher:   pub,
		Topic:       func(*testing.T) string { return testenv.UniqueName("outbox.event.t") },
		Read: func(ctx context.Context, topic string, n int) ([]broker.Message, error) {
			return readTopic(ctx, addrs(), topic, n)
		},
		Restart: restart,
	}
}

func TestConformance(t *testing.T) { conformance(t, harness) }

// TestConformanceRestart restarts kfake on the same port and data folder.
func TestConformanceRestart(t *testing.T) { conformanceRestart(t, harness) }

// conformance runs the broker suite on a fresh kfake cluster for each test, through
// the publisher harness makes.
func conformance(t *testing.T, harness func(*testing.T, func() []string, func(*testing.T)) *brokertest.Harness) {
	t.Helper()
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		c := newCluster(t)
		t.Cleanup(c.Close)
		return harness(t, c.ListenAddrs, nil)
	})
}

// conformanceRestart is conformance on a cluster the suite can restart, on the same
// port and data folder.
func conformanceRestart(t *testing.T, harness func(*testing.T, func() []string, func(*testing.T)) *brokertest.Harness) {
	t.Helper()
	brokertest.Run(t, func(t *testing.T) *brokertest.Harness {
		t.Helper()
		port, dir := testenv.FreePort(t), t.TempDir()
		c := newCluster(t, kfake.Ports(port), kfake.DataDir(dir), kfake.SyncWrites())
		t.Cleanup(func() { c.Close() })
		return harness(t, func() []string { return c.ListenAddrs() }, func(t *testing.T) {
			t.Helper()
			c.Close()
			c = newCluster(t, kfake.Ports(port), kfake.DataDir(dir), kfake.SyncWrites())
		})
	})
}

// TestInjectedProduceErrors: errors returned by the broker for a produce request are
// classified; a retriable one is retried inside the client.
func TestInjectedProduceErrors(t *testing.T) {
	for _, tc := range []struct {
		name              string
		code              int16
		permanent, ok     bool
		unavailable, once bool
	}{
		// The client retries a retriable error by itself; the record gets through.
		{"not leader, once", kerr.NotLeaderForPartition.Code, false, true, false, true},
		// Every produce request fails: the record is not acknowledged within the
		// call's deadline, a failure that costs the event no attempt.
		{"not leader, always", kerr.NotLeaderForPartition.Code, false, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, kfake.SeedTopics(1, "orders"))
			defer c.Close()
			c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				if !tc.once {
					c.KeepControl()
				}
				req := kreq.(*kmsg.ProduceRequest)
				resp := req.ResponseKind().(*kmsg.ProduceResponse)
				for _, rt := range req.Topics {
					st := kmsg.NewProduceResponseTopic()
					st.Topic = rt.Topic
					for _, rp := range rt.Partitions {
						sp := kmsg.NewProduceResponseTopicPartition()
						sp.Partition = rp.Partition
						sp.ErrorCode = tc.code
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})
			ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
			defer cancel()
			pub, err := kafka.Dial(ctx, "kafka://"+c.ListenAddrs()[0], nil, kgo.RecordRetries(3))
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			res := pub.Publish(ctx, []broker.Message{{ID: "a", Topic: "orders", Key: "k", Payload: []byte("{}")}})
			err = res[0].Err
			t.Logf("%s: %v", tc.name, err)
			unavailable := broker.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded)
			if tc.ok != (err == nil) || tc.permanent != broker.IsPermanent(err) || tc.unavailable != unavailable {
				t.Fatalf("err = %v; want ok=%v permanent=%v", err, tc.ok, tc.permanent)
			}
		})
	}
}

// TestPartitionerMatchesJava: a key goes to the partition the Java client (and so
// Kafka Connect and Debezium) would pick: murmur2(key) mod partitions.
func TestPartitionerMatchesJava(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(6, "orders"))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub, err := kafka.Dial(ctx, "kafka://"+c.ListenAddrs()[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// Expected partitions for 6 partitions, from the Java client's
	// Utils.toPositive(Utils.murmur2(key.getBytes(UTF_8))) % 6.
	keys := []string{"1", "42", "customer-7", "order-0001"}
	var msgs []broker.Message
	for i, k := range keys {
		msgs = append(msgs, broker.Message{ID: fmt.Sprint(i), Topic: "orders", Key: k, Payload: []byte("{}")})
	}
	for _, r := range pub.Publish(ctx, msgs) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	cl, _ := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	got := map[string]int32{}
	for len(got) < len(keys) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[string(r.Key)] = r.Partition })
	}
	for _, k := range keys {
		if want := javaPartition([]byte(k), 6); got[k] != want {
			t.Errorf("key %q on partition %d, Java client: %d", k, got[k], want)
		}
	}
}

// javaPartition is Kafka's Utils.murmur2, written out from the Java source so the test
// does not use the code it checks.
func javaPartition(data []byte, n int32) int32 {
	const seed, m, r = uint32(0x9747b28c), uint32(0x5bd1e995), 24
	length := len(data)
	h := seed ^ uint32(length)
	for i := 0; i+4 <= length; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := length &^ 3
	switch length % 4 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h&0x7fffffff) % n
}

func TestDialErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, u := range []string{"http://x", "kafka://", "kafka://127.0.0.1:1?sasl=gssapi"} {
		if _, err := kafka.Dial(ctx, u, nil); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	_, err := kafka.Dial(ctx, "kafka://u:hunter2@127.0.0.1:1", nil)
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("closed port: %v", err)
	}
}

// TestPlacedPartitionOutOfRange: a message naming a partition the topic lacks (a
// Debezium partition placement) is refused on its own; the others go through.
func TestPlacedPartitionOutOfRange(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "placed"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := kafka.Dial(ctx, "kafka://"+cluster.ListenAddrs()[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res := p.Publish(ctx, []broker.Message{
		{ID: "a", Topic: "placed", Key: "k1", Payload: []byte("{}"), Partition: 7, HasPartition: true},
		{ID: "b", Topic: "placed", Key: "k2", Payload: []byte("{}"), Partition: 1, HasPartition: true},
		{ID: "c", Topic: "placed", Key: "k3", Payload: []byte("{}")},
	})
	if !broker.IsPermanent(res[0].Err) || res[1].Err != nil || res[2].Err != nil {
		t.Fatalf("results: %v / %v / %v", res[0].Err, res[1].Err, res[2].Err)
	}
}

// TestCompression: by default the records go out uncompressed, as Kafka Connect's
// producer sends them, so a consumer without codecs (kafkajs has no snappy) reads what
// it read under Debezium; --kafka-compression picks a codec, and a name it does not
// know is refused.
func TestCompression(t *testing.T) {
	c := newCluster(t)
	defer c.Close()
	for _, tc := range []struct {
		codec string
		want  uint8 // the record batch's compression attribute
	}{{"", 0}, {"none", 0}, {"gzip", 1}, {"snappy", 2}, {"lz4", 3}, {"zstd", 4}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		extra := []kgo.Opt{kgo.AllowAutoTopicCreation()}
		if tc.codec != "" {
			opt, err := kafka.Compression(tc.codec)
			if err != nil {
				t.Fatal(err)
			}
			extra = append(extra, opt)
		}
		pub, err := kafka.Dial(ctx, "kafka://"+c.ListenAddrs()[0], nil, extra...)
		if err != nil {
			t.Fatal(err)
		}
		topic := testenv.UniqueName("compression")
		// A compressible payload: a codec is never skipped for a batch it would grow.
		payload := []byte(`{"text":"` + strings.Repeat("outbox ", 200) + `"}`)
		res := pub.Publish(ctx, []broker.Message{{ID: "1", Topic: topic, Key: "k", Payload: payload}})
		_ = pub.Close()
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		consumer, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		var got *kgo.Record
		for got == nil && ctx.Err() == nil {
			consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = r })
		}
		consumer.Close()
		cancel()
		if got == nil {
			t.Fatalf("codec %q: no record read", tc.codec)
		}
		if a := got.Attrs.CompressionType(); a != tc.want || string(got.Value) != string(payload) {
			t.Errorf("codec %q: batch compression %d, want %d (payload intact: %v)", tc.codec, a, tc.want, string(got.Value) == string(payload))
		}
	}
	if _, err := kafka.Compression("brotli"); err == nil || !strings.Contains(err.Error(), "zstd") {
		t.Fatalf("an unknown codec: %v", err)
	}
}

// TestTimestampOutOfRange: a record time the client cannot express (a router's event
// timestamp column far in the future, 14222264625338 ms: the year 2420) is refused as
// that message's failure, with its reason, instead of reaching Kafka as another time
// (it used to arrive as -4224479448371); the other messages go on.
func TestTimestampOutOfRange(t *testing.T) {
	c := newCluster(t)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub, err := kafka.Dial(ctx, "kafka://"+c.ListenAddrs()[0], nil, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	topic := testenv.UniqueName("timestamp")
	res := pub.Publish(ctx, []broker.Message{
		{ID: "1", Topic: topic, Key: "far", Payload: []byte(`{}`), Timestamp: time.UnixMilli(14222264625338)},
		{ID: "2", Topic: topic, Key: "near", Payload: []byte(`{}`), Timestamp: time.UnixMilli(1_700_000_000_000)},
	})
	if !broker.IsPermanent(res[0].Err) || !strings.Contains(res[0].Err.Error(), "14222264625338") || res[1].Err != nil {
		t.Fatalf("results %v", res)
	}
}
