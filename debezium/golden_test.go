package debezium_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/outboxd/outbox/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// record is what a Kafka consumer sees.
type record struct {
	topic, key, value string
	headers           string // k=v;... in order
}

func (r record) String() string {
	return fmt.Sprintf("topic=%s key=%s headers=[%s] value=%s", r.topic, r.key, r.headers, r.value)
}

// The Debezium documentation's example row, inserted by plain SQL as a Java service
// would, and the row with a header column value.
const orderPayload = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`

// TestGolden relays rows from PostgreSQL to Kafka (kfake) with the router and checks
// every record against what Debezium's Outbox Event Router emits for the same row and
// options (topic, key, headers, value).
func TestGolden(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var jsonbText string // how PostgreSQL (and so Debezium's pgoutput) renders the payload
	if err := pool.QueryRow(ctx, "SELECT $1::jsonb::text", orderPayload).Scan(&jsonbText); err != nil {
		t.Fatal(err)
	}
	const id = "4d47e190-0402-4048-bc2c-89dd54343cdc"
	for _, tc := range []struct {
		name string
		opts map[string]string
		want record
	}{
		{"defaults", nil, record{topic: "outbox.event.Order", key: "1", headers: "id=" + id, value: jsonbText}},
		{"connect prefix, replacement, header placement",
			map[string]string{
				"transforms.outbox.route.topic.replacement":           "${routedByValue}.events",
				"transforms.outbox.table.fields.additional.placement": "type:header:eventType",
			},
			record{topic: "Order.events", key: "1", headers: "id=" + id + ";eventType=OrderCreated", value: jsonbText}},
		{"regex groups and envelope",
			map[string]string{
				"route.by.field":                    "type",
				"route.topic.regex":                 "(?<aggregate>[A-Z][a-z]+)(?<verb>[A-Z][a-z]+)",
				"route.topic.replacement":           "events.${aggregate}.${verb}",
				"table.fields.additional.placement": "type:envelope:eventType, aggregatetype:header:aggregate",
			},
			record{topic: "events.Order.Created", key: "1", headers: "id=" + id + ";aggregate=Order",
				value: `{"payload":` + jsonbText + `,"eventType":"OrderCreated"}`}},
		{"regex that does not match keeps the raw value",
			map[string]string{"route.topic.regex": "nomatch-(?<routedByValue>.*)"},
			record{topic: "Order", key: "1", headers: "id=" + id, value: jsonbText}},
		{"no key", map[string]string{"table.field.event.key": ""},
			record{topic: "outbox.event.Order", key: "", headers: "id=" + id, value: jsonbText}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := outboxdriver.Table{Schema: testenv.Schema(t, url)}
			drv := outboxpgx.New(pool, &table)
			m, _ := drv.Migrator()
			if _, err := m.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table.Schema, "outbox"}.Sanitize()+
				" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', '1', 'OrderCreated', $2)", id, orderPayload); err != nil {
				t.Fatal(err)
			}
			router, err := debezium.New(tc.opts)
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
			store, _ := drv.Store()
			r, err := relay.New(store, pub, &relay.Config{Router: router, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			_ = r.Start(ctx)
			defer r.Stop(context.Background())

			cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(tc.want.topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation())
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			var got []record
			for len(got) == 0 && ctx.Err() == nil {
				cl.PollFetches(ctx).EachRecord(func(kr *kgo.Record) {
					rec := record{topic: kr.Topic, key: string(kr.Key), value: string(kr.Value)}
					for i, h := range kr.Headers {
						if i > 0 {
							rec.headers += ";"
						}
						rec.headers += h.Key + "=" + string(h.Value)
					}
					got = append(got, rec)
				})
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("records:\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestOptionErrors(t *testing.T) {
	for opt, v := range map[string]string{
		"route.by.field":                    "tenant_id",
		"route.topic.regex":                 "(?<=x)y",
		"table.fields.additional.placement": "seq:partition",
		"table.field.event.timestamp":       "created_at",
		"route.tombstone.on.empty.payload":  "yes",
		"table.field.additional.missing":    "skip",
		"no.such.option":                    "x",
	} {
		if _, err := debezium.New(map[string]string{opt: v}); err == nil {
			t.Errorf("%s=%s accepted", opt, v)
		}
	}
	if !debezium.IsOption("transforms.outbox.route.by.field") || debezium.IsOption("batch-size") {
		t.Error("IsOption")
	}
}
