package poison_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	awstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	_ "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go/jetstream"
	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/mqtt"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/broker/pubsub"
	"github.com/outboxd/outbox/broker/redis"
	sqspub "github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/broker/sqs/sqsemu"
	"github.com/outboxd/outbox/broker/stdout"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
	"github.com/outboxd/outbox/outboxdriver/outboxsql"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

func quietLogger() *slog.Logger { return testenv.QuietLogger() }

// utf8Text: valid UTF-8 without NUL, as a PostgreSQL text column takes it.
func utf8Text(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return false
		}
	}
	return true
}

func optional(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func migrate(t *testing.T, m outboxdriver.Migrator, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func postgres(t *testing.T) *db {
	t.Helper()
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	sdb, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	table := outboxdriver.Table{Schema: schema}
	drv := outboxsql.New(sdb, &table)
	m, err := drv.Migrator()
	migrate(t, m, err)
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	return &db{name: "PostgreSQL", store: store, sql: sdb,
		insert: "INSERT INTO " + pgx.Identifier{schema, "outbox"}.Sanitize() +
			" (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext) VALUES ($1, $2, $3, $4, $5, $6, $7)",
		accepts: func(r *row) bool {
			_, idErr := uuid.Parse(r.id)
			return idErr == nil && utf8Text(r.aggregateType, r.aggregateID, r.typ, optional(r.headers), optional(r.trace)) &&
				(r.payload == nil || json.Valid(r.payload) && !bytes.Contains(r.payload, []byte(`\u0000`))) &&
				(r.headers == nil || json.Valid([]byte(*r.headers)) && !strings.Contains(*r.headers, `\u0000`))
		}}
}

func mariadb(t *testing.T) *db {
	t.Helper()
	sdb, name := testenv.MariaDB(t, "poison_")
	drv := outboxmysql.New(sdb, &outboxdriver.Table{Name: name, Payload: outboxdriver.PayloadBytes})
	m, err := drv.Migrator()
	migrate(t, m, err)
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	return &db{name: "MariaDB", store: store, sql: sdb,
		insert: "INSERT INTO `" + name + "` (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext) VALUES (?, ?, ?, ?, ?, ?, ?)",
		accepts: func(r *row) bool {
			return utf8.ValidString(r.aggregateType+r.aggregateID+r.typ+optional(r.headers)+optional(r.trace)) &&
				utf8.RuneCountInString(r.aggregateType) <= 255 && utf8.RuneCountInString(r.typ) <= 255 &&
				utf8.RuneCountInString(r.aggregateID) <= 1024
		}}
}

func sqlite(t *testing.T) *db {
	t.Helper()
	sdb, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	drv := outboxsqlite.New(sdb, &outboxsqlite.Options{Table: outboxdriver.Table{Payload: outboxdriver.PayloadBytes}})
	m, err := drv.Migrator()
	migrate(t, m, err)
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	return &db{name: "SQLite", store: store, sql: sdb,
		insert:  "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext) VALUES (?, ?, ?, ?, ?, ?, ?)",
		accepts: func(*row) bool { return true }}
}

func natsPub(t *testing.T) *pub {
	t.Helper()
	url := natstest.URL(t)
	ctx := context.Background()
	prefix := testenv.UniqueName("poison")
	natstest.CreateStream(t, url, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage})
	p, err := natspub.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &pub{name: "NATS", p: p, template: prefix + ".${aggregatetype}"}
}

func amqpPub(t *testing.T) *pub {
	t.Helper()
	url := testenv.ServiceURL(t, "TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "127.0.0.1:5672", "RabbitMQ")
	exchange := testenv.UniqueName("poison.")
	p, err := amqp.Dial(context.Background(), url, &amqp.Config{Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := conn.Channel()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Close()
		_ = ch.ExchangeDelete(exchange, false, false)
		_ = conn.Close()
	})
	return &pub{name: "RabbitMQ", p: p, template: "outbox.event.${aggregatetype}"}
}

func redisPub(t *testing.T) *pub {
	t.Helper()
	url := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
	prefix := testenv.UniqueName("poison:")
	p, err := redis.Dial(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Close()
		opt, _ := goredis.ParseURL(url)
		c := goredis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		keys, _ := c.Keys(ctx, prefix+"*").Result()
		for _, k := range keys {
			_ = c.Del(ctx, k).Err()
		}
	})
	return &pub{name: "Redis", p: p, template: prefix + "${aggregatetype}"}
}

func mqttPub(t *testing.T) *pub {
	t.Helper()
	url := testenv.ServiceURL(t, "TEST_MQTT_URL", "mqtt://127.0.0.1:1883", "127.0.0.1:1883", "Mosquitto")
	p, err := mqtt.Dial(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &pub{name: "MQTT", p: p, template: testenv.UniqueName("poison") + "/${aggregatetype}"}
}

func kafkaPub(t *testing.T) *pub {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	p, err := kafka.Dial(context.Background(), "kafka://"+strings.Join(cluster.ListenAddrs(), ","), nil, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &pub{name: "Kafka (kfake)", p: p, template: "outbox.event.${aggregatetype}"}
}

// pubsubPub publishes to Pub/Sub's own fake (pstest), creating topics as they come
// (the fake has no auto-creation), and reads back what it stored by event id.
func pubsubPub(t *testing.T) *pub {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p, err := pubsub.Dial(context.Background(), "pubsub://outbox-poison", &pubsub.Config{CreateTopics: true}, option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &pub{name: "Pub/Sub (pstest)", p: p, template: "outbox.event.${aggregatetype}", received: func() map[string][]byte {
		out := map[string][]byte{}
		for _, m := range srv.Messages() {
			out[m.Attributes["id"]] = m.Data
		}
		return out
	}}
}

// sqsPub publishes to FIFO queues of the SQS emulator, made as they come, and reads
// every queue back (receiving and deleting) by event id.
func sqsPub(t *testing.T) *pub {
	t.Helper()
	c := sqsemu.Client(sqsemu.Start(t))
	p, err := sqspub.New(c, &sqspub.Config{CreateQueues: true})
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.UniqueName("poison-")
	got := map[string][]byte{}
	return &pub{name: "SQS (emulator)", p: p, template: prefix + "-${aggregatetype}.fifo", received: func() map[string][]byte {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var queues []string
		for in := (&awssqs.ListQueuesInput{QueueNamePrefix: aws.String(prefix), MaxResults: aws.Int32(1000)}); ; {
			out, err := c.ListQueues(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			queues = append(queues, out.QueueUrls...)
			if out.NextToken == nil {
				break
			}
			in.NextToken = out.NextToken
		}
		// Read until every queue says it holds nothing, visible or in flight (a
		// short poll may come back empty while messages wait; a message received
		// whose delete the emulator did not apply comes back after a second).
		left := func() int {
			n := 0
			for _, q := range queues {
				a, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(q),
					AttributeNames: []awstypes.QueueAttributeName{awstypes.QueueAttributeNameApproximateNumberOfMessages, awstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range a.Attributes {
					k, _ := strconv.Atoi(v)
					n += k
				}
			}
			return n
		}
		testenv.Wait(t, ctx, "every message received from the queues", func() bool {
			for _, q := range queues {
				out, err := c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 10, VisibilityTimeout: 1,
					MessageAttributeNames: sqspub.ReceiveAttributeNames, MessageSystemAttributeNames: sqspub.ReceiveSystemAttributeNames})
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range out.Messages {
					d, err := sqspub.Decode(m)
					if err != nil {
						t.Fatal(err)
					}
					got[d.ID] = d.Payload
					if _, err := c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(q), ReceiptHandle: m.ReceiptHandle}); err != nil {
						t.Fatal(err)
					}
				}
			}
			return left() == 0
		})
		return got
	}}
}

func stdoutPub(*testing.T) *pub {
	return &pub{name: "stdout", p: stdout.New(io.Discard), template: "outbox.event.${aggregatetype}"}
}

// webhookPub posts to a receiver of the test's own that checks every signature and
// keeps every body by event id.
func webhookPub(t *testing.T) *pub {
	t.Helper()
	const secret = "whsec_cG9pc29uLXN1aXRl"
	key, _ := webhook.DecodeSecret(secret)
	var mu sync.Mutex
	got := map[string][]byte{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := webhook.Verify(key, req.Header, body, timeNow(), fiveMinutes); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		mu.Lock()
		got[req.Header.Get(webhook.HeaderID)] = body
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	p, err := webhook.Dial(context.Background(), srv.URL, &webhook.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &pub{name: "webhook", p: p, template: "outbox.event.${aggregatetype}", received: func() map[string][]byte {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string][]byte, len(got))
		for k, v := range got {
			out[k] = v
		}
		return out
	}}
}

// TestPoisonEveryBroker: PostgreSQL to each broker.
func TestPoisonEveryBroker(t *testing.T) {
	for _, mk := range []func(*testing.T) *pub{natsPub, amqpPub, redisPub, mqttPub, kafkaPub, pubsubPub, sqsPub, webhookPub, stdoutPub} {
		p := mk(t)
		t.Run(p.name, func(t *testing.T) { run(t, postgres(t), p) })
	}
}

// TestPoisonEveryDriver: each other database to NATS and to the webhook (the brokers
// with the strictest headers).
func TestPoisonEveryDriver(t *testing.T) {
	for _, mkDB := range []func(*testing.T) *db{mariadb, sqlite} {
		for _, mk := range []func(*testing.T) *pub{natsPub, webhookPub} {
			d, p := mkDB(t), mk(t)
			t.Run(d.name+"/"+p.name, func(t *testing.T) { run(t, d, p) })
		}
	}
}

const fiveMinutes = 5 * time.Minute

func timeNow() time.Time { return time.Now() }
