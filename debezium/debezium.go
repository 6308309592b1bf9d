// Package debezium routes outbox rows the way Debezium's Outbox Event Router
// (io.debezium.transforms.outbox.EventRouter) does, configured with the router's own
// option names, and renders each record's key and value with the bytes the chosen
// Kafka Connect converter would have written, so a team moving off Debezium and
// Kafka Connect pastes its connector config and changes no consumer.
//
// Options (defaults as in Debezium; every value is checked at start as Debezium's
// configuration definition checks it):
//
//	route.by.field                          aggregatetype
//	route.topic.regex                       (?<routedByValue>.*)        Java syntax; what Go reads differently is refused
//	route.topic.replacement                 outbox.event.${routedByValue}  Java syntax ($1, ${name}, \$)
//	route.tombstone.on.empty.payload        false
//	table.field.event.id                    id
//	table.field.event.key                   aggregateid (empty: a null key)
//	table.field.event.payload               payload
//	table.field.event.type                  type (accepted, unused, as in Debezium)
//	table.fields.additional.placement       column:header|envelope[:alias], ...
//	table.field.additional.missing          error | ignore
//	table.expand.json.payload               false
//	table.json.payload.null.behavior        ignore | optional_bytes
//	table.json.payload.empty.array.behavior ignore | optional_string
//	table.op.invalid.behavior               warn | error | fatal (updates never reach the relay)
//	tracing.span.context.field              tracingspancontext
//	tracing.operation.name, tracing.with.context.field.only
//
// Columns are those of the outbox table: id, aggregatetype, aggregateid, type,
// payload, tracingspancontext, and headers.NAME for a key of the headers column.
// Options naming other columns (partition placements, table.field.event.timestamp,
// table.field.event.schema.version) are refused at start with the reason.
//
// Converters: key.converter and value.converter as a Kafka Connect config names them
// (StringConverter, the default here; JsonConverter, with schemas unless
// schemas.enable=false); a Debezium Server config writes JSON unless its
// debezium.format.* says otherwise.
package debezium

import (
	"fmt"
	"strings"
	"sync"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/outboxdriver"
)

// Config is what New reads.
type Config struct {
	// Options holds the router's options, bare or as a connector config holds them
	// (transforms.NAME.* or debezium.transforms.NAME.*), and may hold the whole
	// Kafka Connect or Debezium Server config around them: its converters and topic
	// prefix are used, its other keys reported by Ignored.
	Options map[string]string
	// Table is the outbox table: its payload type, and its names, which name the
	// value schema of envelope records under a JSON converter with schemas.
	Table outboxdriver.Table
}

// Router turns rows into the records Debezium would emit. Build it with New.
type Router struct {
	routeBy, idField, keyField, payloadField, traceField string
	topics                                               *regexRouter
	tombstone, ignoreMissing                             bool
	headers, envelope                                    []placement
	expand                                               *expander // nil: off
	keyConv, valueConv                                   Converter
	bytesPayload                                         bool
	schemaPrefix                                         string // "<topic.prefix>.<schema>.<table>."
	ignored                                              []string

	mu            sync.Mutex
	envelopeNamed string // the value schema's name, fixed by the first record as in Debezium
}

// Enabled reports whether a config names the router at all (one of its options, or
// a transform of its class): without it the relay keeps its own wire format.
func Enabled(options map[string]string) bool {
	c, err := readConnector(options)
	return err != nil || c.present
}

// New builds a router. Unknown or unsupported options, values Debezium would refuse,
// transforms other than the router and converters it cannot reproduce are errors.
func New(cfg *Config) (*Router, error) {
	c, err := readConnector(cfg.Options)
	if err != nil {
		return nil, fmt.Errorf("debezium: %w", err)
	}
	o, err := resolve(c.router)
	if err != nil {
		return nil, fmt.Errorf("debezium: %w", err)
	}
	t := cfg.Table.WithDefaults()
	r := &Router{
		routeBy: o["route.by.field"], idField: o["table.field.event.id"], keyField: o["table.field.event.key"],
		payloadField: o["table.field.event.payload"], traceField: o["tracing.span.context.field"],
		tombstone:     strings.EqualFold(o["route.tombstone.on.empty.payload"], "true"),
		ignoreMissing: strings.EqualFold(o["table.field.additional.missing"], "ignore"),
		keyConv:       c.key, valueConv: c.value, bytesPayload: t.Payload == outboxdriver.PayloadBytes,
		ignored:      c.ignored,
		schemaPrefix: t.Schema + "." + t.Name + ".",
	}
	if c.prefix != "" {
		r.schemaPrefix = c.prefix + "." + r.schemaPrefix
	}
	for _, f := range []struct{ opt, col string }{{"route.by.field", r.routeBy}, {"table.field.event.id", r.idField},
		{"table.field.event.payload", r.payloadField}, {"tracing.span.context.field", r.traceField}} {
		if err := checkColumn(f.col); err != nil {
			return nil, fmt.Errorf("debezium: router option %s: %w", f.opt, err)
		}
	}
	if r.keyField != "" {
		if err := checkColumn(r.keyField); err != nil {
			return nil, fmt.Errorf("debezium: router option table.field.event.key: %w", err)
		}
	}
	for _, opt := range []string{"table.field.event.timestamp", "table.field.event.schema.version"} {
		if o[opt] != "" {
			return nil, fmt.Errorf("debezium: router option %s: column %q: %w", opt, o[opt], errCustomColumn)
		}
	}
	if r.topics, err = newRegexRouter(o["route.topic.regex"], o["route.topic.replacement"]); err != nil {
		return nil, fmt.Errorf("debezium: router option %w", err)
	}
	if p := o["table.fields.additional.placement"]; p != "" || c.router["table.fields.additional.placement"] != "" {
		ps, err := parsePlacements(p)
		if err != nil {
			return nil, fmt.Errorf("debezium: router option table.fields.additional.placement: %w", err)
		}
		for _, pl := range ps {
			if err := checkColumn(pl.column); err != nil {
				return nil, fmt.Errorf("debezium: placement %s:%s: %w", pl.column, pl.where, err)
			}
			switch pl.where {
			case "header":
				r.headers = append(r.headers, pl)
			case "envelope":
				r.envelope = append(r.envelope, pl)
			case "partition":
				return nil, fmt.Errorf("debezium: placement %s:partition: %w", pl.column, errCustomColumn)
			}
		}
	}
	if strings.EqualFold(o["table.expand.json.payload"], "true") {
		// Under StringConverter an expanded payload is written as Struct.toString()
		// (Struct{a=1}), as Debezium writes it; expansion is meant for JsonConverter.
		r.expand = &expander{
			keepNulls:       strings.EqualFold(o["table.json.payload.null.behavior"], "optional_bytes"),
			keepEmptyArrays: strings.EqualFold(o["table.json.payload.empty.array.behavior"], "optional_string"),
		}
	}
	return r, nil
}

var errCustomColumn = fmt.Errorf("only the outbox table's own columns can be named (id, aggregatetype, aggregateid, type, payload, tracingspancontext, headers.NAME)")

// Ignored lists the keys of the config that change nothing here (the connector's
// own settings: connection, slot, snapshot, ...), for the caller to report once.
func (r *Router) Ignored() []string { return r.ignored }

var columns = map[string]bool{"id": true, "aggregatetype": true, "aggregateid": true, "type": true, "payload": true, "tracingspancontext": true}

func checkColumn(c string) error {
	if columns[c] || strings.HasPrefix(c, "headers.") && len(c) > len("headers.") {
		return nil
	}
	return fmt.Errorf("unknown column %q: %w", c, errCustomColumn)
}

// columnSchema is the Connect schema Debezium's PostgreSQL connector gives a column
// of the outbox table.
func (r *Router) columnSchema(col string) *schema {
	switch col {
	case "id":
		return uuidSchema
	case "aggregatetype", "aggregateid", "type":
		return stringSchema
	case "payload":
		if r.bytesPayload {
			return bytesColumnSchema
		}
		return jsonColumnSchema
	}
	return optionalStringSchema
}

// value returns a row's column, and whether the row has it (a headers.NAME whose key
// is absent has not).
func (r *Router) value(row *outboxdriver.Row, col string) (any, bool) {
	switch col {
	case "id":
		return row.ID, true
	case "aggregatetype":
		return row.AggregateType, true
	case "aggregateid":
		return row.AggregateID, true
	case "type":
		return row.Type, true
	case "payload":
		switch {
		case row.PayloadNull:
			return nil, true
		case r.bytesPayload:
			return row.Payload, true
		}
		return string(row.Payload), true
	case "tracingspancontext":
		if row.TraceContext == "" {
			return nil, true
		}
		return row.TraceContext, true
	}
	v, ok := row.Headers[strings.TrimPrefix(col, "headers.")]
	return v, ok
}

// text is a column's value as text, as a header or a topic holds it.
func (r *Router) text(row *outboxdriver.Row, col string) string {
	v, _ := r.value(row, col)
	if v == nil {
		return ""
	}
	return javaString(v)
}

// Route returns the record Debezium's router and the configured converters would
// emit for row. escape (may be nil) is applied to the routed-by value, for brokers
// with a topic syntax of their own. A missing additional column is an error unless
// table.field.additional.missing=ignore.
func (r *Router) Route(row *outboxdriver.Row, escape func(string) string) (broker.Message, error) {
	routed := r.text(row, r.routeBy)
	if escape != nil {
		routed = escape(routed)
	}
	msg := broker.Message{ID: r.text(row, r.idField), Topic: r.topics.topic(routed), Verbatim: true, KeyNull: true}
	if r.keyField != "" {
		kv, _ := r.value(row, r.keyField)
		k, ok := r.keyConv.convert(r.columnSchema(r.keyField), kv)
		msg.Key, msg.KeyNull = string(k), !ok
	}
	msg.Headers = make(map[string]string, 1+len(r.headers))
	msg.HeaderOrder = make([]string, 0, 1+len(r.headers))
	addHeader := func(k, v string) {
		if _, dup := msg.Headers[k]; !dup {
			msg.HeaderOrder = append(msg.HeaderOrder, k)
		}
		msg.Headers[k] = v
	}
	addHeader("id", msg.ID)
	for _, p := range r.headers {
		v, ok := r.value(row, p.column)
		if !ok {
			if r.ignoreMissing {
				continue
			}
			return msg, fmt.Errorf("debezium placement: row %s has no %s", row.ID, p.column)
		}
		if v == nil {
			v = ""
		}
		addHeader(p.alias, javaString(v))
	}

	payload, _ := r.value(row, r.payloadField)
	payloadSchema := r.columnSchema(r.payloadField)
	if s, ok := payload.(string); ok && r.expand != nil {
		// A payload that does not expand stays the string, as Debezium logs and keeps it.
		if es, ev, err := r.expand.expand(s); err == nil {
			payloadSchema, payload = es, ev
		}
	}
	// Emptiness is the raw payload's (Object.toString().trim()), never the envelope's.
	empty := payload == nil
	if s, ok := payload.(string); ok {
		empty = strings.TrimFunc(s, func(c rune) bool { return c <= ' ' }) == ""
	}
	var (
		valueSchema = payloadSchema
		value       = payload
	)
	switch {
	case empty && r.tombstone:
		valueSchema, value = nil, nil
	case len(r.envelope) > 0:
		env, err := r.envelopeValue(row, routed, payloadSchema, payload)
		if err != nil {
			return msg, err
		}
		valueSchema, value = env.schema, env
	}
	b, ok := r.valueConv.convert(valueSchema, value)
	msg.Payload, msg.PayloadNull = b, !ok

	if tc := r.text(row, r.traceField); tc != "" {
		for k, v := range broker.TraceHeaders(tc) {
			addHeader(k, v)
		}
	}
	return msg, nil
}

// envelopeValue is the struct {payload, <alias>...} of envelope placements.
func (r *Router) envelopeValue(row *outboxdriver.Row, routed string, payloadSchema *schema, payload any) (*structValue, error) {
	s := &schema{typ: "struct", name: r.envelopeName(routed), fields: []field{{"payload", payloadSchema}}}
	v := &structValue{schema: s, values: []any{payload}}
	for _, p := range r.envelope {
		pv, ok := r.value(row, p.column)
		if !ok {
			if r.ignoreMissing {
				continue
			}
			return nil, fmt.Errorf("debezium placement: row %s has no %s", row.ID, p.column)
		}
		s.fields = append(s.fields, field{p.alias, r.columnSchema(p.column)})
		v.values = append(v.values, pv)
	}
	return v, nil
}

// envelopeName is the value schema's name: the table's record name with the routed
// value before its last part ("<prefix>.<schema>.<table>.<routed>.Value"). Debezium
// caches the schema it builds for the first record, so every later record carries
// that first record's name; so does this router, from its start.
func (r *Router) envelopeName(routed string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.envelopeNamed == "" {
		r.envelopeNamed = r.schemaPrefix + routed + ".Value"
	}
	return r.envelopeNamed
}
