package outboxpgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	url := testenv.DatabaseURL(t)
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[pgx.Tx] {
		pool := testenv.Pool(t, url)
		table := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "outbox", Payload: payload}
		return &outboxdrivertest.Harness[pgx.Tx]{
			Driver:   outboxpgx.New(pool, &table),
			Begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
			Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			InsertPlain: func(ctx context.Context, id, at, aid, typ, payload string) error {
				_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+
					" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)", id, at, aid, typ, payload)
				return err
			},
			MultipleClaims:    true,
			ConcurrentWriters: true,
		}
	})
}

// TestAdoptDebeziumTable: migrating an existing Debezium outbox table (its five
// columns, rows already in it) adds what the relay needs and keeps the rows.
func TestAdoptDebeziumTable(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	schema := testenv.Schema(t, url)
	ctx := context.Background()
	qt := pgx.Identifier{schema, "OutboxEvent"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+qt+` (id uuid NOT NULL PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb);
		INSERT INTO `+qt+` VALUES ('4d47e190-0402-4048-bc2c-89dd54343cdc', 'Order', '1', 'OrderCreated', '{"id": 1}'),
		                          ('5d47e190-0402-4048-bc2c-89dd54343cdc', 'Order', '1', 'OrderShipped', '{"id": 1}')`); err != nil {
		t.Fatal(err)
	}
	drv := outboxpgx.New(pool, &outboxdriver.Table{Schema: schema, Name: "OutboxEvent"})
	m, _ := drv.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatalf("migrate an existing Debezium table: %v", err)
	}
	store, _ := drv.Store()
	c, err := store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx)
	rows := c.Rows()
	if len(rows) != 2 || rows[0].Type != "OrderCreated" || rows[1].Type != "OrderShipped" || rows[0].Seq >= rows[1].Seq {
		t.Fatalf("rows after adoption: %+v", rows)
	}
}
