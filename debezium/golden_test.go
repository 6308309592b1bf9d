package debezium_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	"github.com/outboxd/outbox/relay/relaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGolden relays the e2e cases of routerCases end to end: the row inserted into
// PostgreSQL by plain SQL (as a Java service writes it), read by the relay in poll
// mode and in CDC mode (the WAL, as Debezium reads it), published to Kafka (kfake, an
// in-process Kafka speaking the real protocol), and the record a consumer reads
// compared byte for byte with what Debezium's router and converter would write.
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			table := outboxdriver.Table{Schema: testenv.Schema(t, url)}
			source := migratedSource(ctx, t, pool, table, mode)
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

// relayOne relays with a router built from opts into a fresh Kafka (3 partitions per
// topic) and returns the first record of topic.
func relayOne(ctx context.Context, t *testing.T, src outboxdriver.Source, opts map[string]string, table outboxdriver.Table, topic string) record {
	t.Helper()
	return asRecord(relayRecord(ctx, t, src, &debezium.Config{Options: opts, Table: table}, topic))
}

func relayRecord(ctx context.Context, t *testing.T, src outboxdriver.Source, cfg *debezium.Config, topic string) *kgo.Record {
	t.Helper()
	router, err := debezium.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	pub, err := kafka.Dial(ctx, "kafka://"+cluster.ListenAddrs()[0], nil, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := relaytest.Start(t, src, pub, &relay.Config{Router: router})
	defer func() { _ = r.Stop(context.Background()) }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for ctx.Err() == nil {
		if recs := cl.PollFetches(ctx).Records(); len(recs) > 0 {
			return recs[0]
		}
	}
	t.Fatalf("no record on %s", topic)
	return nil
}

func asRecord(kr *kgo.Record) record {
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
	return rec
}

// TestGoldenCustomColumns relays, in poll and CDC mode, from the table Debezium's
// Quarkus extension creates (varchar columns, a "timestamp" column, a varchar
// payload), adopted by outbox migrate, with the custom columns Debezium's router
// tests use: the cases that name columns beyond the outbox's own.
func TestGoldenCustomColumns(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			table := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "outboxevent"}
			qtable := pgx.Identifier{table.Schema, table.Name}.Sanitize()
			if _, err := pool.Exec(ctx, `CREATE TABLE `+qtable+` (
  id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL,
  "timestamp" timestamp NOT NULL, payload varchar(8000), tracingspancontext varchar(256),
  tenant text, p integer, version integer NOT NULL DEFAULT 1, is_deleted boolean, payload_id integer)`); err != nil {
				t.Fatal(err)
			}
			source := migratedSource(ctx, t, pool, table, mode) // adopts the Quarkus table
			var cols []debezium.Column
			rows, _ := pool.Query(ctx, `SELECT attname, format_type(atttypid, NULL), attnotnull FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, qtable)
			for rows.Next() {
				var c debezium.Column
				if err := rows.Scan(&c.Name, &c.Type, &c.NotNull); err != nil {
					t.Fatal(err)
				}
				cols = append(cols, c)
			}
			if rows.Err() != nil || len(cols) == 0 {
				t.Fatalf("columns: %v", rows.Err())
			}
			eventTime := time.Date(2019, 1, 31, 12, 13, 1, 123_000_000, time.UTC)
			for _, tc := range []struct {
				test      string
				opts      map[string]string
				want      record
				partition int32
			}{
				{test: "canSetTimestampByUserDefinedConfiguration", opts: map[string]string{"table.field.event.timestamp": "timestamp"},
					want: record{topic: defaultTopic, key: p(dbzAggID), headers: idHeader, value: p("{}")}, partition: -1},
				{test: "canSetPartitionWithAdditionalFields", opts: map[string]string{"table.fields.additional.placement": "p:partition"},
					want: record{topic: defaultTopic, key: p(dbzAggID), headers: idHeader, value: p("{}")}, partition: 2},
				{test: "canMarkAnEventAsDeleted (a boolean column in the envelope)",
					opts: with("json", map[string]string{"table.fields.additional.placement": "is_deleted:envelope:deleted"}),
					want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"payload":"{}","deleted":true}`)}, partition: -1},
				{test: "canInfluenceTableColumnTypes (an integer key, a boolean in the envelope)",
					opts: with("json", map[string]string{"table.field.event.key": "payload_id", "table.fields.additional.placement": "is_deleted:envelope:bool"}),
					want: record{topic: defaultTopic, key: p("1232"), headers: idHeader, value: p(`{"payload":"{}","bool":true}`)}, partition: -1},
				{test: "canSetSchemaVersionWhenMoreThanPayloadIsInEnvelope (JsonConverter, schemas on)",
					opts: with("json-schemas", map[string]string{"table.field.event.schema.version": "version", "table.fields.additional.placement": "type:envelope:eventType"}),
					want: record{topic: defaultTopic, key: p(`{"schema":{"type":"string","optional":false},"payload":"` + dbzAggID + `"}`), headers: idHeader,
						value: p(`{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"field":"payload"},{"type":"string","optional":false,"field":"eventType"}],` +
							`"optional":false,"name":"dbserver1.` + table.Schema + `.outboxevent.User.Value","version":1},"payload":{"payload":"{}","eventType":"UserCreated"}}`)}, partition: -1},
				{test: "documentation: a custom column as a header", opts: map[string]string{"table.fields.additional.placement": "tenant:header:tenantId"},
					want: record{topic: defaultTopic, key: p(dbzAggID), headers: idHeader + ";tenantId=acme", value: p("{}")}, partition: -1},
			} {
				t.Run(tc.test, func(t *testing.T) {
					if _, err := pool.Exec(ctx, "INSERT INTO "+qtable+` (id, aggregatetype, aggregateid, type, "timestamp", payload, tenant, p, version, is_deleted, payload_id)
VALUES ($1, $2, $3, $4, $5, '{}', 'acme', 2, 1, true, 1232)`, dbzID, dbzAggType, dbzAggID, dbzType, eventTime); err != nil {
						t.Fatal(err)
					}
					defer func() { _, _ = pool.Exec(context.Background(), "DELETE FROM "+qtable) }()
					kr := relayRecord(ctx, t, source(t), &debezium.Config{Options: tc.opts, Table: table, TableColumns: cols}, tc.want.topic)
					if got := asRecord(kr); !got.equal(tc.want) {
						t.Fatalf("record:\n got %v\nwant %v", got, tc.want)
					}
					if tc.partition >= 0 && kr.Partition != tc.partition {
						t.Fatalf("partition %d, want %d", kr.Partition, tc.partition)
					}
					if tc.opts["table.field.event.timestamp"] != "" && !kr.Timestamp.Equal(eventTime) {
						t.Fatalf("record timestamp %v, want %v", kr.Timestamp, eventTime)
					}
				})
			}
		})
	}
}

// migratedSource migrates table (creating or adopting it) and returns a func that
// opens the relay's source in mode: the table store (poll) or a CDC source on a slot
// dropped when the test ends.
func migratedSource(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table outboxdriver.Table, mode string) func(*testing.T) outboxdriver.Source {
	t.Helper()
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatalf("migrate %s: %v", table, err)
	}
	if mode != "cdc" {
		return func(*testing.T) outboxdriver.Source {
			s, _ := drv.Store()
			return s
		}
	}
	testenv.LogicalReplication(t, pool)
	slot := pgcdc.DefaultSlot(table)
	t.Cleanup(func() {
		if err := testenv.DropSlot(context.Background(), pool, slot); err != nil {
			t.Error(err)
		}
	})
	return func(t *testing.T) outboxdriver.Source {
		t.Helper()
		s, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: testenv.QuietLogger(), StatusInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		// The next case starts from the WAL's present, as poll mode's next case starts
		// from an empty table: an event of this case the relay published but did not
		// confirm (a produce that failed after its record landed goes out again: at
		// least once) must not be read as the next case's record. That a stopped relay
		// confirms what it published is pgcdc's TestCleanStopRepublishesNothing.
		t.Cleanup(func() { advanceSlot(t, pool, slot) })
		return s
	}
}

// advanceSlot moves slot to the current WAL position once no relay streams from it.
func advanceSlot(t *testing.T, pool *pgxpool.Pool, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	// Until the stopped relay's walsender has left, the slot is active and refuses.
	testenv.WaitTell(t, ctx, "slot "+slot+" to advance", func() bool {
		_, err = pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
		return err == nil
	}, func() string { return fmt.Sprint(err) })
}
