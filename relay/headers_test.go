package relay_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay"
)

// TestRowHeadersCannotImpersonate: a row written by plain SQL carries headers named
// as the relay's own in other letter cases (Id, OUTBOX-SEQ, AggregateId, EventType,
// Ce-Source, Ce-Id, Outbox-Late). The relay drops them, in outbox's format and in
// CloudEvents', keeps the row's other headers, and the event goes out with the real
// values.
func TestRowHeadersCannotImpersonate(t *testing.T) {
	for _, format := range []string{"outbox", "cloudevents"} {
		t.Run(format, func(t *testing.T) {
			e := setup(t)
			ctx := context.Background()
			forged := `{"Id": "forged", "OUTBOX-SEQ": "999", "AggregateId": "forged", "EventType": "Forged", "Ce-Source": "/forged",
				"Ce-Id": "forged", "Outbox-Late": "delayed", "tenant": "acme"}`
			table := pgx.Identifier{e.table.Schema, e.table.Name}.Sanitize()
			if _, err := e.pool.Exec(ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload, headers)
VALUES (gen_random_uuid(), 'order', '42', 'Placed', '{}', $1::jsonb)`, forged); err != nil {
				t.Fatal(err)
			}
			b := memory.New(0)
			cfg := &relay.Config{Logger: quietLogger()}
			if format == "cloudevents" {
				router, err := cloudevents.New(&cloudevents.Config{Source: "/outbox/test", Binding: cloudevents.NATS})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Router = router
			}
			startRelay(t, e, b, cfg)
			testenv.Wait(t, ctx, "the event published", func() bool { return len(b.Messages()) == 1 })
			m := b.Messages()[0]
			if m.AggregateID != "42" && format == "outbox" {
				t.Fatalf("aggregate id %q", m.AggregateID)
			}
			for k, v := range m.Headers {
				if strings.Contains(v, "forged") || strings.EqualFold(k, "outbox-late") || strings.EqualFold(k, "outbox-seq") && v == "999" {
					t.Fatalf("a forged header went out: %s: %s (headers %v)", k, v, m.Headers)
				}
			}
			if m.Headers["tenant"] != "acme" {
				t.Fatalf("the row's own header was lost: %v", m.Headers)
			}
			if format == "cloudevents" && m.Headers["ce-source"] != "/outbox/test" {
				t.Fatalf("ce-source %q, want the router's", m.Headers["ce-source"])
			}
		})
	}
}
