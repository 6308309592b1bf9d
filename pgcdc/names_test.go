package pgcdc_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay/relaytest"
)

func TestDefaultSlotNames(t *testing.T) {
	t.Parallel()
	if got := pgcdc.DefaultSlot(outboxdriver.Table{}); got != "outbox_public_outbox" {
		t.Fatalf("default table's slot %q, want the name it always had", got)
	}
	a := pgcdc.DefaultSlot(outboxdriver.Table{Schema: "a_b", Name: "c"})
	b := pgcdc.DefaultSlot(outboxdriver.Table{Schema: "a", Name: "b_c"})
	c := pgcdc.DefaultSlot(outboxdriver.Table{Schema: "a", Name: "B_c"})
	long := pgcdc.DefaultSlot(outboxdriver.Table{Schema: "public", Name: strings.Repeat("x", 63)})
	if a == b || b == c || a == c {
		t.Fatalf("slots collide: %q %q %q", a, b, c)
	}
	if len(long) > 63 {
		t.Fatalf("slot %q longer than 63 bytes", long)
	}
}

// TestTablesWhoseSlotNamesUsedToCollide: a_b.c and a.b_c (here S_b.c and S.b_c) both
// relayed completely by their own CDC relays (failure class: the old default names
// were both outbox_a_b_c, and one relay read the other's WAL while its own rows were
// never published). A publication of another table is refused.
func TestTablesWhoseSlotNamesUsedToCollide(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	testenv.LogicalReplication(t, pool)
	ctx := context.Background()
	schema := testenv.Schema(t, url)
	other := schema + "_b"
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{other}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{other}.Sanitize()+" CASCADE")
	})
	tables := []outboxdriver.Table{{Schema: schema, Name: "b_c"}, {Schema: other, Name: "c"}}
	brokers := make([]*memory.Broker, len(tables))
	for i, table := range tables {
		drv := outboxpgx.New(pool, &table)
		m, _ := drv.Migrator()
		if _, err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		slot := pgcdc.DefaultSlot(table)
		t.Cleanup(func() { dropSlot(t, pool, slot) })
		src, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: quiet(), StatusInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := src.Init(ctx); err != nil {
			t.Fatal(err)
		}
		brokers[i] = memory.New(0)
		relaytest.Start(t, src, brokers[i], nil)
		w, err := outbox.NewWriter(drv, nil)
		if err != nil {
			t.Fatal(err)
		}
		for n := range 50 {
			ev := outbox.Event{AggregateType: "order", AggregateID: "agg-0", Type: "Step", Payload: []byte(`{"i":` + strconv.Itoa(n) + `}`)}
			if err := w.Write(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, b := range brokers {
		checkDelivery(t, waitMessages(t, b, 50), 1, 50)
	}

	// A slot and publication named for the first table, given to the second: refused.
	drv := outboxpgx.New(pool, &tables[1])
	src, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: quiet(), Slot: pgcdc.DefaultSlot(tables[0])})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Init(ctx); !errors.Is(err, pgcdc.ErrForeignPublication) {
		t.Fatalf("another table's publication: %v, want ErrForeignPublication", err)
	}
}
