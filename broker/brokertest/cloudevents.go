package brokertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/outboxdriver"
)

// ToCloudEvent reads a message as the broker delivered it with the CloudEvents Go
// SDK (github.com/cloudevents/sdk-go/v2): HTTP through the SDK's own HTTP binding,
// the other brokers through the SDK's binding machinery over their headers, named
// as binding b says (the SDK's protocol modules for Kafka, NATS, AMQP and MQTT are
// not served to this build). The SDK parses, types and validates every attribute.
func ToCloudEvent(m *broker.Message, b cloudevents.Binding) (*event.Event, error) {
	var msg binding.Message
	if b.Name == cloudevents.HTTP.Name {
		h := http.Header{}
		for k, v := range m.Headers {
			h.Set(k, v)
		}
		h.Set("Content-Type", m.ContentType)
		msg = cehttp.NewMessage(h, io.NopCloser(bytes.NewReader(m.Payload)))
	} else {
		msg = newHeaderMessage(m, b)
	}
	ev, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		return nil, err
	}
	return ev, ev.Validate()
}

// headerMessage is a binding.Message over a delivered message's headers.
type headerMessage struct {
	m        *broker.Message
	b        cloudevents.Binding
	version  spec.Version
	ct       string
	encoding binding.Encoding
}

func newHeaderMessage(m *broker.Message, b cloudevents.Binding) *headerMessage {
	hm := &headerMessage{m: m, b: b, ct: m.ContentType}
	if b.ContentTypeHeader != "" {
		hm.ct = header(m.Headers, b.ContentTypeHeader)
	}
	specs := spec.WithPrefix(b.Prefix)
	switch {
	case format.Lookup(hm.ct) != nil:
		hm.encoding = binding.EncodingStructured
	case header(m.Headers, specs.PrefixedSpecVersionName()) != "":
		hm.version = specs.Version(header(m.Headers, specs.PrefixedSpecVersionName()))
		hm.encoding = binding.EncodingBinary
	case b.NoBinary && json.Valid(m.Payload):
		hm.ct, hm.encoding = cloudevents.StructuredContentType, binding.EncodingStructured // no header to say so
	}
	return hm
}

func header(h map[string]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

func (h *headerMessage) ReadEncoding() binding.Encoding { return h.encoding }

func (h *headerMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if h.encoding != binding.EncodingStructured {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, format.Lookup(h.ct), bytes.NewReader(h.m.Payload))
}

func (h *headerMessage) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	if h.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range h.m.Headers {
		switch {
		case h.b.ContentTypeHeader != "" && strings.EqualFold(k, h.b.ContentTypeHeader):
			if err := w.SetAttribute(h.version.AttributeFromKind(spec.DataContentType), v); err != nil {
				return err
			}
		case h.version.Attribute(k) != nil:
			if err := w.SetAttribute(h.version.Attribute(k), v); err != nil {
				return err
			}
		case strings.HasPrefix(strings.ToLower(k), strings.ToLower(h.b.Prefix)):
			if err := w.SetExtension(strings.ToLower(k[len(h.b.Prefix):]), v); err != nil {
				return err
			}
		}
	}
	if h.b.ContentTypeHeader == "" && h.ct != "" {
		if err := w.SetAttribute(h.version.AttributeFromKind(spec.DataContentType), h.ct); err != nil {
			return err
		}
	}
	if len(h.m.Payload) > 0 {
		return w.SetData(bytes.NewReader(h.m.Payload))
	}
	return nil
}

func (h *headerMessage) Finish(error) error { return nil }

// GetAttribute implements binding.MessageMetadataReader.
func (h *headerMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	attr := h.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	v := header(h.m.Headers, attr.PrefixedName())
	if k == spec.DataContentType {
		v = h.ct
	}
	if v == "" {
		return attr, nil
	}
	return attr, v
}

// GetExtension implements binding.MessageMetadataReader.
func (h *headerMessage) GetExtension(name string) interface{} {
	if v := header(h.m.Headers, h.b.Prefix+name); v != "" {
		return v
	}
	return nil
}

// testCloudEvents: rows rendered by the CloudEvents router, in each mode the broker's
// binding carries, published and read back, are events the SDK accepts with every
// attribute as docs/cloudevents.md maps it.
func testCloudEvents(t *testing.T, newHarness NewFunc) {
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t)
			if h.CloudEvents.Name == "" {
				t.Fatal("the harness names no CloudEvents binding")
			}
			tmpl, err := broker.ParseTemplate(h.Topic(t))
			if err != nil {
				t.Fatal(err)
			}
			r, err := cloudevents.New(&cloudevents.Config{Mode: mode, Binding: h.CloudEvents, Source: "/outbox/public.outbox", Topic: tmpl})
			if mode == cloudevents.Binary && h.CloudEvents.NoBinary {
				if err == nil {
					t.Fatalf("binary mode on %s, which has no binding: accepted", h.CloudEvents.Name)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			at := time.Date(2026, 12, 1, 10, 11, 12, 123456000, time.UTC)
			rows := []outboxdriver.Row{
				{ID: "0194f4a6-0000-7000-8000-000000000001", AggregateType: "order", AggregateID: "o-1", Type: "OrderPlaced", Seq: 41,
					Payload: []byte(`{"total":990,"items":["a"]}`), CreatedAt: at, Headers: map[string]string{"tenant": "acme"},
					TraceContext: "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
				{ID: "0194f4a6-0000-7000-8000-000000000002", AggregateType: "order", AggregateID: "o-1", Type: "Invoice", Seq: 42,
					Payload: []byte("%PDF\x00\xff"), CreatedAt: at.Add(time.Second)},
			}
			msgs := make([]broker.Message, len(rows))
			for i := range rows {
				if msgs[i], err = r.Route(&rows[i], nil); err != nil {
					t.Fatal(err)
				}
			}
			ctx := ctxT(t, 30*time.Second)
			requireOK(t, h.Publisher.Publish(ctx, msgs), len(msgs))
			got, err := h.Read(ctx, msgs[0].Topic, len(msgs))
			if err != nil {
				t.Fatal(err)
			}
			for i := range rows {
				ev, err := ToCloudEvent(&got[i], h.CloudEvents)
				if err != nil {
					t.Fatalf("event %d as delivered (%+v): the SDK refuses it: %v", i, got[i], err)
				}
				checkEvent(t, ev, &rows[i])
			}
		})
	}
}

func checkEvent(t *testing.T, ev *event.Event, row *outboxdriver.Row) {
	t.Helper()
	ct := "application/json"
	if !json.Valid(row.Payload) {
		ct = "application/octet-stream"
	}
	for _, c := range [][3]string{
		{"id", ev.ID(), row.ID},
		{"source", ev.Source(), "/outbox/public.outbox"},
		{"specversion", ev.SpecVersion(), "1.0"},
		{"type", ev.Type(), row.Type},
		{"subject", ev.Subject(), row.AggregateID},
		{"time", ev.Time().UTC().Format(time.RFC3339Nano), row.CreatedAt.UTC().Format(time.RFC3339Nano)},
		{"datacontenttype", ev.DataContentType(), ct},
		{"aggregatetype", fmt.Sprint(ev.Extensions()["aggregatetype"]), row.AggregateType},
		{"partitionkey", fmt.Sprint(ev.Extensions()["partitionkey"]), row.AggregateID},
		{"sequence", fmt.Sprint(ev.Extensions()["sequence"]), fmt.Sprint(row.Seq)},
	} {
		if c[1] != c[2] {
			t.Errorf("event %s: %s = %q, want %q", row.ID, c[0], c[1], c[2])
		}
	}
	if tp := broker.TraceHeaders(row.TraceContext)["traceparent"]; tp != "" && fmt.Sprint(ev.Extensions()["traceparent"]) != tp {
		t.Errorf("event %s: traceparent = %v, want %q", row.ID, ev.Extensions()["traceparent"], tp)
	}
	if !bytes.Equal(ev.Data(), row.Payload) && !(ct == "application/json" && jsonEqual(ev.Data(), row.Payload)) {
		t.Errorf("event %s: data = %q, want %q", row.ID, ev.Data(), row.Payload)
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}
