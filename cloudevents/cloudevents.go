// Package cloudevents renders outbox events as CloudEvents 1.0
// (https://cloudevents.io): a relay.Router that maps each row to the event's
// attributes and puts them on the wire as the CloudEvents protocol binding of the
// broker says, in binary mode (attributes as headers, the payload as the body) or in
// structured mode (the whole event as one JSON document, application/cloudevents+json).
//
// The mapping, from the row:
//
//	id              the event id
//	source          Config.Source (default /outbox/<schema>.<table>)
//	specversion     1.0
//	type            the event type
//	subject         the aggregate id
//	time            the write time (created_at), RFC 3339 in UTC
//	datacontenttype application/json for a JSON payload, else application/octet-stream
//	aggregatetype   extension: the aggregate type
//	sequence        extension (CloudEvents "sequence"): outbox-seq, the write position
//	partitionkey    extension (CloudEvents "partitioning"): the aggregate id
//	traceparent     extension (CloudEvents "distributed tracing"), with tracestate
//	outboxlate      extension: outbox-late, when the relay marks the event late
//
// The event's own headers travel beside the attributes as the broker's plain headers
// (they are no CloudEvents attributes), on brokers that have headers.
package cloudevents

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// Mode is how an event is put on the wire.
type Mode string

// Modes.
const (
	// Binary puts the attributes in the message's headers (named as the broker's
	// binding says) and the payload, unchanged, in its body.
	Binary Mode = "binary"
	// Structured puts the whole event in the body as JSON (the CloudEvents JSON event
	// format): a JSON payload as "data", any other as "data_base64".
	Structured Mode = "structured"
)

// StructuredContentType is the media type of a structured-mode body.
const StructuredContentType = "application/cloudevents+json"

// SpecVersion is the CloudEvents version written.
const SpecVersion = "1.0"

// Binding is how a protocol carries the attributes in binary mode.
type Binding struct {
	// Name is the binding's name, for messages.
	Name string
	// Prefix goes before each attribute's name in a header ("ce_" for Kafka).
	Prefix string
	// ContentTypeHeader, when set, is the header that carries datacontenttype
	// ("content-type"); when empty, the broker's own content-type slot
	// (broker.Message.ContentType) carries it.
	ContentTypeHeader string
	// NoBinary: CloudEvents defines no binding for the broker, so it takes structured
	// mode only (the event's own headers still travel as the broker carries them).
	NoBinary bool
}

// The bindings of the brokers the relay publishes to.
var (
	Kafka  = Binding{Name: "Kafka", Prefix: "ce_", ContentTypeHeader: "content-type"}
	NATS   = Binding{Name: "NATS", Prefix: "ce-", ContentTypeHeader: "content-type"}
	HTTP   = Binding{Name: "HTTP", Prefix: "ce-"}          // Content-Type: the webhook publisher's slot
	AMQP   = Binding{Name: "AMQP", Prefix: "cloudEvents_"} // content_type: the message property
	MQTT   = Binding{Name: "MQTT", Prefix: ""}             // user properties; Content Type: the MQTT 5 property
	PubSub = Binding{Name: "Pub/Sub", Prefix: "ce-", ContentTypeHeader: "content-type"}
	Redis  = Binding{Name: "Redis Streams", NoBinary: true}
	SQS    = Binding{Name: "SQS", NoBinary: true}
	Stdout = Binding{Name: "stdout", NoBinary: true}
)

// ErrNoBinaryMode: CloudEvents defines no binding (binary mode) for the broker; use
// structured mode.
var ErrNoBinaryMode = errors.New("cloudevents: no binary mode for this broker")

// Config configures a Router.
type Config struct {
	// Mode is Binary (default) or Structured.
	Mode Mode
	// Binding is the broker's protocol binding (Kafka, NATS, HTTP, AMQP, MQTT, PubSub,
	// or Redis, SQS and Stdout, which have none).
	Binding Binding
	// Source is the source attribute (a URI reference). Default "/outbox/" + Table.
	Source string
	// Table is the outbox table, for the default Source.
	Table outboxdriver.Table
	// Topic is the topic template (default: broker.DefaultTemplate).
	Topic *broker.Template
}

// Router renders rows as CloudEvents. It implements relay.Router.
type Router struct {
	cfg Config
}

// New returns a Router, refusing a mode the binding cannot carry.
func New(cfg *Config) (*Router, error) {
	c := *cfg
	if c.Mode == "" {
		c.Mode = Binary
	}
	if c.Mode != Binary && c.Mode != Structured {
		return nil, fmt.Errorf("cloudevents: mode %q: want binary or structured", c.Mode)
	}
	if c.Mode == Binary && c.Binding.NoBinary {
		return nil, fmt.Errorf("%w (CloudEvents has no %s binding): use structured mode", ErrNoBinaryMode, c.Binding.Name)
	}
	if c.Source == "" {
		c.Source = "/outbox/" + c.Table.WithDefaults().String()
	}
	if c.Topic == nil {
		t, err := broker.ParseTemplate(broker.TopicTemplateDefault)
		if err != nil {
			return nil, err
		}
		c.Topic = t
	}
	return &Router{cfg: c}, nil
}

// attributes are the event's context attributes and extensions, in wire order.
func (r *Router) attributes(row *outboxdriver.Row) [][2]string {
	attrs := [][2]string{
		{"specversion", SpecVersion},
		{"id", row.ID},
		{"source", r.cfg.Source},
		{"type", row.Type},
		{"subject", row.AggregateID},
	}
	if !row.CreatedAt.IsZero() {
		attrs = append(attrs, [2]string{"time", row.CreatedAt.UTC().Format(time.RFC3339Nano)})
	}
	attrs = append(attrs, [2]string{"aggregatetype", row.AggregateType}, [2]string{"partitionkey", row.AggregateID})
	if row.Seq > 0 {
		attrs = append(attrs, [2]string{"sequence", strconv.FormatInt(row.Seq, 10)})
	}
	for k, v := range broker.TraceHeaders(row.TraceContext) {
		if k == "traceparent" || k == "tracestate" {
			attrs = append(attrs, [2]string{k, v})
		}
	}
	if late := row.Headers[wire.HeaderLate]; late != "" {
		attrs = append(attrs, [2]string{"outboxlate", late})
	}
	return attrs
}

// dataContentType is the payload's media type.
func dataContentType(row *outboxdriver.Row) string {
	if json.Valid(row.Payload) {
		return "application/json"
	}
	return "application/octet-stream"
}

// Route implements relay.Router.
func (r *Router) Route(row *outboxdriver.Row, escape func(string) string) (broker.Message, error) {
	m := broker.Message{
		ID:        row.ID,
		Topic:     r.cfg.Topic.Execute(broker.TopicFields{AggregateType: row.AggregateType, Type: row.Type}, escape),
		Key:       row.AggregateID,
		Verbatim:  true,
		Timestamp: row.CreatedAt,
		Headers:   map[string]string{},
	}
	add := func(k, v string) {
		if _, dup := m.Headers[k]; !dup {
			m.HeaderOrder = append(m.HeaderOrder, k)
		}
		m.Headers[k] = v
	}
	attrs := r.attributes(row)
	switch r.cfg.Mode {
	case Binary:
		for _, a := range attrs {
			add(r.cfg.Binding.Prefix+a[0], a[1])
		}
		m.Payload, m.PayloadNull = row.Payload, row.PayloadNull
		if !row.PayloadNull {
			ct := dataContentType(row)
			if h := r.cfg.Binding.ContentTypeHeader; h != "" {
				add(h, ct)
			} else {
				m.ContentType = ct
			}
		}
	case Structured:
		body, err := structured(attrs, row)
		if err != nil {
			return m, err
		}
		m.Payload, m.ContentType = body, StructuredContentType
		if h := r.cfg.Binding.ContentTypeHeader; h != "" {
			add(h, StructuredContentType)
		}
	}
	// The event's own headers: plain headers beside the attributes (never over one).
	// Where attributes carry no prefix (MQTT), every user property reads as an
	// attribute, so only names valid as one go.
	// A name taken in another letter case is taken too: brokers and consumers read
	// header names without regard to case.
	for _, k := range slices.Sorted(maps.Keys(row.Headers)) {
		if taken(m.Headers, k) || !wire.RowHeaderAllowed(k) || k == wire.HeaderLate || (r.cfg.Binding.Prefix == "" && !extensionName(k)) {
			continue
		}
		add(k, row.Headers[k])
	}
	return m, nil
}

// taken reports whether h has name k in any letter case.
func taken(h map[string]string, k string) bool {
	for name := range h {
		if strings.EqualFold(name, k) {
			return true
		}
	}
	return false
}

// extensionName reports whether s is a valid CloudEvents attribute name: ASCII
// letters and digits, at most 20.
func extensionName(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// structured is the JSON event format of the event.
func structured(attrs [][2]string, row *outboxdriver.Row) ([]byte, error) {
	doc := make(map[string]any, len(attrs)+2)
	for _, a := range attrs {
		doc[a[0]] = a[1]
	}
	switch {
	case row.PayloadNull:
	case json.Valid(row.Payload):
		doc["datacontenttype"] = "application/json"
		doc["data"] = json.RawMessage(row.Payload)
	default:
		doc["datacontenttype"] = "application/octet-stream"
		doc["data_base64"] = base64.StdEncoding.EncodeToString(row.Payload)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("cloudevents: event %s: %w", row.ID, err)
	}
	return b, nil
}
