package main

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSaga runs the saga on the machine's PostgreSQL and NATS, in schemas and a
// stream of its own: the order within the payment limit ships, the one over it is
// cancelled by the compensation.
func TestSaga(t *testing.T) {
	url := testenv.DatabaseURL(t)
	natsURL := natstest.URL(t)
	pool := testenv.Pool(t, url)
	prefix := testenv.UniqueName("saga_")
	t.Cleanup(func() {
		for _, svc := range []string{"order", "payment", "shipping"} {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+prefix+"_"+svc+" CASCADE")
		}
		natstest.DeleteStream(natsURL, prefix)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	states, err := run(ctx, url, natsURL, prefix, []int{500, 5000, 999})
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 3 {
		t.Fatalf("final states %v", states)
	}
	// Each order's fate, and the other services' rows: charged once, shipped once.
	want := map[int]string{500: "SHIPPED", 5000: "CANCELLED", 999: "SHIPPED"}
	rows, err := pool.Query(ctx, `SELECT o.amount, o.status, p.status, s.order_id IS NOT NULL
FROM `+prefix+`_order.orders o JOIN `+prefix+`_payment.payments p ON p.order_id = o.id
LEFT JOIN `+prefix+`_shipping.shipments s ON s.order_id = o.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var amount int
		var status, payment string
		var shipped bool
		if err := rows.Scan(&amount, &status, &payment, &shipped); err != nil {
			t.Fatal(err)
		}
		n++
		if status != want[amount] || shipped != (status == "SHIPPED") || (payment == "CHARGED") != (status == "SHIPPED") {
			t.Errorf("order of %d: %s, payment %s, shipped %v", amount, status, payment, shipped)
		}
	}
	if rows.Err() != nil || n != 3 {
		t.Fatalf("%d orders with a payment (%v)", n, rows.Err())
	}
}
