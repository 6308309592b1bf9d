// Package kafka publishes outbox events to Kafka with franz-go, as Debezium's Outbox
// Event Router does: topic outbox.event.<aggregatetype>, key = aggregate id, value =
// payload, header id = event id plus the other wire-format headers.
//
// The producer is idempotent with acks=all (franz-go's default), so retries inside the
// client never duplicate or reorder a partition. Keys go to partitions with the Java
// client's partitioner (murmur2), so a key lands on the same partition as with Kafka
// Connect. A batch is produced asynchronously, all records in flight at once.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/redact"
)

// MaxMessageBytesDefault matches Kafka's default message.max.bytes (about 1 MB).
const MaxMessageBytesDefault = 1_000_000

// Config configures a Publisher.
type Config struct {
	// MaxMessageBytes refuses larger records (payload, key and headers) before they
	// are sent, so a key's later records can be held back. Set it to the topic's
	// max.message.bytes. Default MaxMessageBytesDefault.
	MaxMessageBytes int
	// DeliveryTimeout bounds each Publish: records not acknowledged by then fail as
	// unavailable. (The client's own RecordDeliveryTimeout is not used: it counts
	// from the record's timestamp, which a router may set in the past.) Default
	// DeliveryTimeoutDefault.
	DeliveryTimeout time.Duration
}

// DeliveryTimeoutDefault is Config.DeliveryTimeout's default.
const DeliveryTimeoutDefault = 30 * time.Second

// Publisher produces to Kafka. Build it with New or Dial.
type Publisher struct {
	c   *kgo.Client
	cfg Config
	own bool
}

// New returns a publisher on a client the caller built (and closes). Build it with
// ClientOptions (or at least keep idempotence and the default partitioner).
func New(c *kgo.Client, cfg *Config) (*Publisher, error) {
	if c == nil {
		return nil, errors.New("kafka publisher: client is nil")
	}
	p := &Publisher{c: c}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.MaxMessageBytes <= 0 {
		p.cfg.MaxMessageBytes = MaxMessageBytesDefault
	}
	if p.cfg.DeliveryTimeout <= 0 {
		p.cfg.DeliveryTimeout = DeliveryTimeoutDefault
	}
	return p, nil
}

// ClientOptions are the producer settings the relay relies on: idempotent writes
// with acks=all, the Java-compatible key partitioner, and no compression, as Kafka
// Connect's producer (compression.type=none): a consumer that read Debezium's records
// reads these with the codecs it had (franz-go alone would compress with snappy, which
// kafkajs cannot read without a plug-in). Compression picks another.
func ClientOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(placedFirst{kgo.StickyKeyPartitioner(nil)}), // nil: murmur2, as the Java client
		kgo.ProducerBatchMaxBytes(MaxMessageBytesDefault + 1024),
	}
}

// Compressions names the codecs Compression knows; none is the default.
const Compressions = "none, gzip, snappy, lz4 or zstd"

// Compression is the client option that compresses produced batches with codec (see
// Compressions). Every consumer must have that codec.
func Compression(codec string) (kgo.Opt, error) {
	var c kgo.CompressionCodec
	switch codec {
	case "none", "":
		c = kgo.NoCompression()
	case "gzip":
		c = kgo.GzipCompression()
	case "snappy":
		c = kgo.SnappyCompression()
	case "lz4":
		c = kgo.Lz4Compression()
	case "zstd":
		c = kgo.ZstdCompression()
	default:
		return nil, fmt.Errorf("kafka compression %q: want %s", codec, Compressions)
	}
	return kgo.ProducerBatchCompression(c), nil
}

// ConnectOptions are the client options a kafka:// URL names:
// kafka://host:9092[,host2:9092][?tls=true&sasl=plain|scram-sha-256|scram-sha-512]
// (user and password in the URL's user info). Dial uses them; so does a consumer that
// must reach the same cluster.
func ConnectOptions(rawURL string) ([]kgo.Opt, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "kafka" && u.Scheme != "kafkas") || u.Host == "" {
		return nil, fmt.Errorf("Kafka URL %q: want kafka://host:9092[,host:9092][?tls=true&sasl=plain]", redact.Endpoint(rawURL))
	}
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(u.Host, ",")...)}
	q := u.Query()
	if u.Scheme == "kafkas" || q.Get("tls") == "true" {
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	if mech := q.Get("sasl"); mech != "" {
		user := u.User.Username()
		pass, _ := u.User.Password()
		switch strings.ToLower(mech) {
		case "plain":
			opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
		case "scram-sha-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
		case "scram-sha-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
		default:
			return nil, fmt.Errorf("Kafka URL: unknown sasl %q (want plain, scram-sha-256, scram-sha-512)", mech)
		}
	}
	return opts, nil
}

// Dial builds a client from a kafka:// URL (see ConnectOptions), checks a broker
// answers, and returns a publisher that owns the client.
func Dial(ctx context.Context, rawURL string, cfg *Config, extra ...kgo.Opt) (*Publisher, error) {
	conn, err := ConnectOptions(rawURL)
	if err != nil {
		return nil, err
	}
	c, err := kgo.NewClient(append(append(ClientOptions(), conn...), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	if err := c.Ping(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("connect to Kafka at %s: %w", redact.Endpoint(rawURL), err)
	}
	p, _ := New(c, cfg)
	p.own = true
	return p, nil
}

var (
	_ broker.Publisher      = (*Publisher)(nil)
	_ broker.TopicValidator = (*Publisher)(nil)
)

// ValidateTopic implements broker.TopicValidator with Kafka's rule for topic names:
// 1 to 249 of [a-zA-Z0-9._-], and not "." or "..".
func (p *Publisher) ValidateTopic(topic string) error { return ValidateTopic(topic) }

// ValidateTopic is the method without a publisher.
func ValidateTopic(topic string) error {
	if topic == "" || topic == "." || topic == ".." || len(topic) > 249 {
		return fmt.Errorf("invalid Kafka topic %q: 1 to 249 characters, not . or ..", topic)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("invalid Kafka topic %q: only letters, digits, '.', '_' and '-' are allowed", topic)
		}
	}
	return nil
}

// Record builds the Kafka record for a message: what Debezium's router emits.
func Record(m *broker.Message) *kgo.Record {
	r := &kgo.Record{Topic: m.Topic, Key: []byte(m.Key), Value: m.Payload, Timestamp: m.Timestamp}
	r.Headers = make([]kgo.RecordHeader, 0, m.HeaderCount())
	m.EachHeader(func(k, v string) { r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) })
	if m.PayloadNull {
		r.Value = nil // a tombstone, as Debezium emits for a NULL payload
	}
	if m.KeyNull {
		r.Key = nil
	}
	if m.HasPartition {
		r.Partition = m.Partition
		r.Context = context.WithValue(context.Background(), placedKey{}, true)
	}
	return r
}

// Publish implements broker.Publisher. It returns when every record is answered or
// ctx ends; records still unanswered then fail with ctx's error (their late answers
// are ignored: the relay publishes them again, which the id header makes harmless).
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	return publish(ctx, p.c, &p.cfg, msgs, nil)
}

// publish produces msgs on c through broker.Sequence; sent, if not nil, records which
// messages were handed to the client.
func publish(ctx context.Context, c *kgo.Client, cfg *Config, msgs []broker.Message, sent []bool) []broker.Result {
	// Records are produced under a context bounded by the delivery timeout: franz-go
	// fails a record whose context ends, so none outlives the batch.
	pctx, cancel := context.WithTimeout(ctx, cfg.DeliveryTimeout)
	defer cancel()
	return broker.Sequence(ctx, msgs, broker.Schedule{AckTimeout: cfg.DeliveryTimeout}, broker.Sender{
		Prepare: func(_ context.Context, i int) error {
			m := &msgs[i]
			if err := ValidateTopic(m.Topic); err != nil {
				// A name Kafka refuses (from an aggregate type, say): franz-go would
				// only retry it until the delivery timeout.
				return broker.Permanent(err)
			}
			if size := recordSize(m); cfg.MaxMessageBytes > 0 && size > cfg.MaxMessageBytes {
				return broker.Permanent(fmt.Errorf("message of %d bytes exceeds the limit of %d", size, cfg.MaxMessageBytes))
			}
			if ts := m.Timestamp; !ts.IsZero() && (ts.Before(minTimestamp) || ts.After(maxTimestamp)) {
				// franz-go computes a record's time in int64 nanoseconds: sent, this
				// one would arrive as another time, silently.
				return broker.Permanent(fmt.Errorf("record timestamp %d ms is outside what the Kafka client can send (years 1678 to 2262)", ts.UnixMilli()))
			}
			return nil
		},
		Send: func(_ context.Context, i int) (broker.Future, error) {
			placed := msgs[i].HasPartition
			if sent != nil {
				sent[i] = true
			}
			f := make(produced, 1)
			c.Produce(pctx, Record(&msgs[i]), func(_ *kgo.Record, err error) {
				if err != nil && placed && strings.Contains(err.Error(), "partitioning choice") {
					// The message named a partition the topic does not have: its fault.
					err = broker.Permanent(fmt.Errorf("kafka: the placed partition: %w", err))
				}
				f <- err
			})
			return f, nil
		},
		Classify: func(err error) error { return classify(ctx, err) },
	})
}

// The record times franz-go can send: it counts them in int64 nanoseconds.
var (
	minTimestamp = time.Unix(0, math.MinInt64)
	maxTimestamp = time.Unix(0, math.MaxInt64)
)

// produced is a record's answer to come, from its produce callback.
type produced chan error

// Wait implements broker.Future.
func (f produced) Wait(ctx context.Context) error {
	select {
	case err := <-f:
		return err
	default:
	}
	select {
	case err := <-f:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func recordSize(m *broker.Message) int {
	size := len(m.Key) + len(m.Payload) + len(m.Topic)
	m.EachHeader(func(k, v string) { size += len(k) + len(v) })
	return size
}

func classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge), errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.InvalidRequiredAcks):
		return broker.Permanent(err)
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		// The topic's, not the connection's: other topics go on; this message is
		// retried on its own schedule (an attempt each time).
		return broker.Deferred(fmt.Errorf("%w (create the topic, or let the broker create topics)", err))
	case kerr.IsRetriable(err), errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrClientClosed), errors.Is(err, context.DeadlineExceeded):
		return broker.Unavailable(err)
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return err // a broker error that is neither: worth retrying, counts an attempt
	}
	return broker.Unavailable(err) // connection-level failures
}

// Features implements broker.Publisher. The idempotent producer drops the duplicates
// of its own retries; a record sent again after a relay crash is a new record, so
// consumers dedup by the id header (the inbox does).
func (p *Publisher) Features() broker.Features {
	return broker.Features{PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// Close implements broker.Publisher.
func (p *Publisher) Close() error {
	if p.own {
		p.c.Close()
	}
	return nil
}

// placedFirst sends a record whose message names its partition (Debezium's partition
// placement) there, and partitions the others as its inner partitioner does. A
// partition the topic does not have fails that record.
type placedFirst struct{ inner kgo.Partitioner }

type placedKey struct{}

func placed(r *kgo.Record) bool { return r.Context != nil && r.Context.Value(placedKey{}) != nil }

func (p placedFirst) ForTopic(topic string) kgo.TopicPartitioner {
	inner := p.inner.ForTopic(topic)
	if nb, ok := inner.(kgo.TopicPartitionerOnNewBatch); ok {
		return placedTopicOnNewBatch{placedTopic{inner}, nb}
	}
	return placedTopic{inner}
}

type placedTopic struct{ inner kgo.TopicPartitioner }

func (p placedTopic) RequiresConsistency(r *kgo.Record) bool {
	return placed(r) || p.inner.RequiresConsistency(r)
}

func (p placedTopic) Partition(r *kgo.Record, n int) int {
	if placed(r) {
		return int(r.Partition) // out of range: kgo fails the record
	}
	return p.inner.Partition(r, n)
}

type placedTopicOnNewBatch struct {
	placedTopic
	nb kgo.TopicPartitionerOnNewBatch
}

func (p placedTopicOnNewBatch) OnNewBatch() { p.nb.OnNewBatch() }
