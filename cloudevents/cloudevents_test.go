package cloudevents_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/outboxdriver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func row() *outboxdriver.Row {
	return &outboxdriver.Row{ID: "0194f4a6-0000-7000-8000-000000000001", AggregateType: "order", AggregateID: "o-1", Type: "OrderPlaced",
		Seq: 7, Payload: []byte(`{"total":990}`), CreatedAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		Headers: map[string]string{"tenant": "acme", "correlation-id": "c1", "outbox-late": "delayed"}}
}

func Example() {
	r, _ := cloudevents.New(&cloudevents.Config{Binding: cloudevents.Kafka, Table: outboxdriver.Table{}})
	m, _ := r.Route(row(), nil)
	m.EachHeader(func(k, v string) { fmt.Printf("%s: %s\n", k, v) })
	fmt.Printf("key %s, topic %s, body %s\n", m.Key, m.Topic, m.Payload)
	// Output:
	// ce_specversion: 1.0
	// ce_id: 0194f4a6-0000-7000-8000-000000000001
	// ce_source: /outbox/public.outbox
	// ce_type: OrderPlaced
	// ce_subject: o-1
	// ce_time: 2026-12-01T10:00:00Z
	// ce_aggregatetype: order
	// ce_partitionkey: o-1
	// ce_sequence: 7
	// ce_outboxlate: delayed
	// content-type: application/json
	// correlation-id: c1
	// tenant: acme
	// key o-1, topic outbox.event.order, body {"total":990}
}

// TestRefused: a mode the broker has no binding for, or no mode at all, is refused
// when the router is built (the relay refuses to start), not per event.
func TestRefused(t *testing.T) {
	for _, b := range []cloudevents.Binding{cloudevents.Redis, cloudevents.SQS, cloudevents.Stdout} {
		if _, err := cloudevents.New(&cloudevents.Config{Binding: b}); !errors.Is(err, cloudevents.ErrNoBinaryMode) {
			t.Errorf("binary mode on %s: %v, want ErrNoBinaryMode", b.Name, err)
		}
		if _, err := cloudevents.New(&cloudevents.Config{Binding: b, Mode: cloudevents.Structured}); err != nil {
			t.Errorf("structured mode on %s: %v", b.Name, err)
		}
	}
	if _, err := cloudevents.New(&cloudevents.Config{Binding: cloudevents.Kafka, Mode: "batch"}); err == nil || !strings.Contains(err.Error(), "binary or structured") {
		t.Errorf("an unknown mode: %v", err)
	}
}

// TestStructured: the body is the JSON event format; a non-JSON payload goes as
// data_base64, a NULL payload as no data at all.
func TestStructured(t *testing.T) {
	r, err := cloudevents.New(&cloudevents.Config{Binding: cloudevents.Redis, Mode: cloudevents.Structured, Source: "urn:orders"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		payload []byte
		null    bool
		want    map[string]any
	}{
		{[]byte(`{"total":990}`), false, map[string]any{"data": map[string]any{"total": 990.0}, "datacontenttype": "application/json"}},
		{[]byte("%PDF\x00"), false, map[string]any{"data_base64": "JVBERgA=", "datacontenttype": "application/octet-stream"}},
		{nil, true, map[string]any{}},
	} {
		rw := row()
		rw.Payload, rw.PayloadNull = tc.payload, tc.null
		m, err := r.Route(rw, nil)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(m.Payload, &doc); err != nil {
			t.Fatalf("body is no JSON: %v: %s", err, m.Payload)
		}
		if m.ContentType != cloudevents.StructuredContentType || doc["id"] != rw.ID || doc["source"] != "urn:orders" || doc["subject"] != "o-1" || doc["sequence"] != "7" {
			t.Fatalf("structured event: %s (content type %q)", m.Payload, m.ContentType)
		}
		for k, v := range tc.want {
			if fmt.Sprint(doc[k]) != fmt.Sprint(v) {
				t.Errorf("%s = %v, want %v", k, doc[k], v)
			}
		}
		if tc.null && (doc["data"] != nil || doc["data_base64"] != nil || doc["datacontenttype"] != nil) {
			t.Errorf("a NULL payload has data: %s", m.Payload)
		}
	}
}

// TestMQTTUserProperties: on MQTT every user property reads as an attribute, so an
// event header whose name is no valid attribute name stays off, and none overrides
// an attribute.
func TestMQTTUserProperties(t *testing.T) {
	r, err := cloudevents.New(&cloudevents.Config{Binding: cloudevents.MQTT})
	if err != nil {
		t.Fatal(err)
	}
	rw := row()
	rw.Headers["subject"] = "spoofed"
	m, err := r.Route(rw, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	m.EachHeader(func(k, _ string) { names = append(names, k) })
	if got := strings.Join(names, ","); strings.Contains(got, "correlation-id") || !strings.Contains(got, "tenant") || m.Headers["subject"] != "o-1" {
		t.Fatalf("user properties %s (subject %q)", got, m.Headers["subject"])
	}
	if m.ContentType != "application/json" {
		t.Fatalf("content type %q, want it in MQTT's Content Type property", m.ContentType)
	}
}
