package debezium_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGolden relays the e2e cases of routerCases end to end: the row inserted into
// PostgreSQL by plain SQL (as a Java service writes it), read by the relay in poll
// mode and in CDC mode (the WAL, as Debezium reads it), published to Kafka (kfake, an
// in-process Kafka speaking the real protocol), and the record a consumer reads
// compared byte for byte with what Debezium's router and converter would write.
func TestGolden(t *testing.T) {
	for _, mode := range []string{"poll", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			table := outboxdriver.Table{Schema: testenv.Schema(t, url)}
			drv := outboxpgx.New(pool, &table)
			m, _ := drv.Migrator()
			if _, err := m.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			source := func(t *testing.T) outboxdriver.Source {
				s, _ := drv.Store()
				return s
			}
			if mode == "cdc" {
				testenv.LogicalReplication(t, pool)
				slot := pgcdc.DefaultSlot(table)
				t.Cleanup(func() {
					if err := testenv.DropSlot(context.Background(), pool, slot); err != nil {
						t.Error(err)
					}
				})
				source = func(t *testing.T) outboxdriver.Source {
					s, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: testenv.QuietLogger(), StatusInterval: 100 * time.Millisecond})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
			}
			qtable := pgx.Identifier{table.Schema, "outbox"}.Sanitize()
			for _, tc := range routerCases(table.Schema) {
				if !tc.e2e {
					continue
				}
				t.Run(tc.test, func(t *testing.T) {
					aggType := dbzAggType
					if tc.aggType != "" {
						aggType = tc.aggType
					}
					var payload *string
					if !tc.null {
						payload = p("{}")
						if tc.payload != nil {
							payload = tc.payload
						}
						var jsonb string // the case is written as PostgreSQL renders jsonb
						if err := pool.QueryRow(ctx, "SELECT $1::jsonb::text", *payload).Scan(&jsonb); err != nil || jsonb != *payload {
							t.Fatalf("payload %s is %s as jsonb (%v)", *payload, jsonb, err)
						}
					}
					if _, err := pool.Exec(ctx, "INSERT INTO "+qtable+" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)",
						dbzID, aggType, dbzAggID, dbzType, payload); err != nil {
						t.Fatal(err)
					}
					defer func() { _, _ = pool.Exec(context.Background(), "DELETE FROM "+qtable) }()
					got := relayOne(ctx, t, source(t), tc.opts, table, tc.want.topic)
					if !got.equal(tc.want) {
						t.Fatalf("record:\n got %v\nwant %v", got, tc.want)
					}
				})
			}
		})
	}
}

// relayOne relays with a router built from opts into a fresh Kafka and returns the
// first record of topic.
func relayOne(ctx context.Context, t *testing.T, src outboxdriver.Source, opts map[string]string, table outboxdriver.Table, topic string) record {
	router, err := debezium.New(&debezium.Config{Options: opts, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	pub, err := kafka.Dial(ctx, "kafka://"+cluster.ListenAddrs()[0], nil, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := testenv.StartRelay(t, src, pub, &relay.Config{Router: router})
	defer func() { _ = r.Stop(context.Background()) }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for ctx.Err() == nil {
		var got []record
		cl.PollFetches(ctx).EachRecord(func(kr *kgo.Record) {
			rec := record{topic: kr.Topic}
			if kr.Key != nil {
				rec.key = p(string(kr.Key))
			}
			if kr.Value != nil {
				rec.value = p(string(kr.Value))
			}
			var hs []string
			for _, h := range kr.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			rec.headers = strings.Join(hs, ";")
			got = append(got, rec)
		})
		if len(got) > 0 {
			return got[0]
		}
	}
	t.Fatalf("no record on %s", topic)
	return record{}
}
