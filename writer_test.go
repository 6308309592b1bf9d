package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewWriterRejects(t *testing.T) {
	if _, err := outbox.NewWriter[any](nil, nil); !errors.Is(err, outbox.ErrNilDriver) {
		t.Errorf("nil driver: %v", err)
	}
	bad := outboxdriver.Table{Name: "outbox; DROP TABLE canary;--"}
	if _, err := outbox.NewWriter(outboxpgx.New(nil, &bad), nil); !errors.Is(err, outboxdriver.ErrInvalidIdentifier) {
		t.Errorf("bad table: %v", err)
	}
	if _, err := outbox.NewWriter(outboxpgx.New(nil, nil), &outbox.Config{MaxHeaders: -1}); err == nil {
		t.Error("negative MaxHeaders accepted")
	}
}

func TestWriteWithoutPool(t *testing.T) {
	w, err := outbox.NewWriter(outboxpgx.New(nil, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = w.Write(context.Background(), outbox.Event{AggregateType: "a", AggregateID: "b", Type: "c", Payload: []byte(`{}`)})
	if !errors.Is(err, outboxdriver.ErrNoPool) {
		t.Fatalf("Write with no pool: %v", err)
	}
}

func TestValidation(t *testing.T) {
	_, drv := testenv.Outbox(t)
	w, err := outbox.NewWriter(drv, &outbox.Config{MaxHeaders: 2})
	if err != nil {
		t.Fatal(err)
	}
	ok := outbox.Event{AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{"a":1}`)}
	for _, tc := range []struct {
		name  string
		mut   func(e *outbox.Event)
		field string
	}{
		{"bad id", func(e *outbox.Event) { e.ID = "12" }, "ID"},
		{"empty type", func(e *outbox.Event) { e.Type = "" }, "Type"},
		{"NUL in aggregate id", func(e *outbox.Event) { e.AggregateID = "a\x00b" }, "AggregateID"},
		{"huge aggregate type", func(e *outbox.Event) { e.AggregateType = strings.Repeat("x", 256) }, "AggregateType"},
		{"1 byte payload", func(e *outbox.Event) { e.Payload = []byte("{") }, "Payload"},
		{"too many headers", func(e *outbox.Event) { e.Headers = map[string]string{"a": "1", "b": "2", "c": "3"} }, "Headers"},
		{"reserved header", func(e *outbox.Event) { e.Headers = map[string]string{"traceparent": "x"} }, "Headers"},
		{"bad header value", func(e *outbox.Event) { e.Headers = map[string]string{"a": "\xff"} }, "Headers"},
		{"header name with a space", func(e *outbox.Event) { e.Headers = map[string]string{"a b": "1"} }, "Headers"},
		{"header name with a colon", func(e *outbox.Event) { e.Headers = map[string]string{"a:b": "1"} }, "Headers"},
		{"header value with a newline", func(e *outbox.Event) { e.Headers = map[string]string{"a": "1\r\nb: 2"} }, "Headers"},
	} {
		ev := ok
		tc.mut(&ev)
		err := w.Write(context.Background(), ev)
		var ee *outbox.EventError
		if !errors.As(err, &ee) || ee.Field != tc.field || !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("%s: err = %v, want an EventError on %s", tc.name, err, tc.field)
		}
	}
	// A valid id is normalised.
	evs := []outbox.Event{ok}
	evs[0].ID = "01A22B45-3608-72DD-8158-F80381AA2EA5"
	if err := w.Write(context.Background(), evs...); err != nil {
		t.Fatal(err)
	}
	if evs[0].ID != "01a22b45-3608-72dd-8158-f80381aa2ea5" {
		t.Fatalf("id = %s", evs[0].ID)
	}
}
