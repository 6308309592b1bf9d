package outboxotel_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxotel"
	"github.com/outboxd/outbox/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTraceCrossesWriterRelayConsumer: the consumer's span is a child of the relay's
// publish span, itself a child of the span that wrote the event, in one trace.
func TestTraceCrossesWriterRelayConsumer(t *testing.T) {
	pool, drv := testenv.Outbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	// The producer: a request span, and the event written inside it.
	w, err := outbox.NewWriter(drv, &outbox.Config{TraceContext: outboxotel.TraceContext(nil)})
	if err != nil {
		t.Fatal(err)
	}
	reqCtx, reqSpan := tp.Tracer("test").Start(ctx, "POST /orders")
	err = pgx.BeginFunc(reqCtx, pool, func(tx pgx.Tx) error {
		return w.WriteTx(reqCtx, tx, outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{}`)})
	})
	reqSpan.End()
	if err != nil {
		t.Fatal(err)
	}

	// The relay.
	store, _ := drv.Store()
	mem := memory.New(0)
	r, err := relay.New(store, mem, &relay.Config{Tracer: outboxotel.NewPublishTracer(tp, nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Start(ctx)
	defer r.Stop(context.Background())
	got, err := mem.Wait(ctx, "", 1)
	if err != nil {
		t.Fatal(err)
	}

	// The consumer.
	ib, err := inbox.NewPgx(pool, &inbox.Config{Table: testenv.UniqueName("inbox_"), StartSpan: outboxotel.InboxSpan(tp, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	msg := inbox.FromHeaders(got[0].Headers, got[0].Payload)
	if _, err := ib.Handle(ctx, "billing", &msg, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	req, pub, proc := spans["POST /orders"], spans["publish outbox.event.order"], spans["process OrderPlaced"]
	if req == nil || pub == nil || proc == nil {
		t.Fatalf("spans: %v", keys(spans))
	}
	if pub.Parent().SpanID() != req.SpanContext().SpanID() || proc.Parent().SpanID() != pub.SpanContext().SpanID() {
		t.Fatalf("span chain broken: publish parent %s (want %s), process parent %s (want %s)",
			pub.Parent().SpanID(), req.SpanContext().SpanID(), proc.Parent().SpanID(), pub.SpanContext().SpanID())
	}
	if pub.SpanContext().TraceID() != req.SpanContext().TraceID() || proc.SpanContext().TraceID() != req.SpanContext().TraceID() {
		t.Fatal("not one trace")
	}
	if got[0].Headers["traceparent"] == "" || got[0].Headers["traceparent"][36:52] != pub.SpanContext().SpanID().String() {
		t.Fatalf("broker header traceparent %q does not name the publish span", got[0].Headers["traceparent"])
	}
}

func keys(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
