// Package debezium routes outbox rows the way Debezium's Outbox Event Router
// (io.debezium.transforms.outbox.EventRouter) does, configured with the router's own
// option names, so a team moving off Debezium and Kafka Connect copies its options and
// changes no consumer.
//
// Supported options (defaults as in Debezium):
//
//	route.by.field                       aggregatetype
//	route.topic.regex                    (?<routedByValue>.*)
//	route.topic.replacement              outbox.event.${routedByValue}
//	route.tombstone.on.empty.payload     false
//	table.field.event.id                 id
//	table.field.event.key                aggregateid (empty: no key)
//	table.field.event.payload            payload
//	table.field.event.type               type (accepted, unused, as in Debezium)
//	table.fields.additional.placement    column:header[:alias], column:envelope[:alias]
//	table.field.additional.missing       error | ignore
//	table.expand.json.payload            accepted: the value is always the payload's JSON bytes
//	table.op.invalid.behavior            accepted: the poll relay never sees updates
//	tracing.span.context.field           tracingspancontext
//
// Columns are those of the outbox table: id, aggregatetype, aggregateid, type,
// payload, tracingspancontext, and headers.NAME for a key of the headers column.
// Options Debezium has and this router does not (partition placement, record
// timestamps from a column, schema versions, custom table columns) are refused with
// an error naming them, never silently ignored.
package debezium

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/outboxdriver"
)

// Router turns rows into messages. Build it with New.
type Router struct {
	routeBy       string
	regex         *regexp.Regexp
	replacement   string
	tombstone     bool
	idField       string
	keyField      string
	payloadField  string
	traceField    string
	headers       []placement
	envelope      []placement
	ignoreMissing bool
}

type placement struct{ column, alias string }

var known = map[string]string{
	"route.by.field":                          "aggregatetype",
	"route.topic.regex":                       "(?<routedByValue>.*)",
	"route.topic.replacement":                 "outbox.event.${routedByValue}",
	"route.tombstone.on.empty.payload":        "false",
	"table.field.event.id":                    "id",
	"table.field.event.key":                   "aggregateid",
	"table.field.event.payload":               "payload",
	"table.field.event.type":                  "type",
	"table.fields.additional.placement":       "",
	"table.field.additional.missing":          "error",
	"table.expand.json.payload":               "false",
	"table.json.payload.null.behavior":        "ignore",
	"table.json.payload.empty.array.behavior": "ignore",
	"table.op.invalid.behavior":               "warn",
	"tracing.span.context.field":              "tracingspancontext",
	"tracing.operation.name":                  "debezium-read",
	"tracing.with.context.field.only":         "false",
}

// IsOption reports whether key is a router option (with or without a Kafka Connect
// "transforms.NAME." prefix).
func IsOption(key string) bool {
	_, ok := known[strip(key)]
	return ok || unsupported[strip(key)] != ""
}

var unsupported = map[string]string{
	"table.field.event.timestamp":      "record timestamps come from the broker",
	"table.field.event.schema.version": "schemas are not emitted",
}

// strip removes a Kafka Connect "transforms.NAME." prefix.
func strip(key string) string {
	if rest, ok := strings.CutPrefix(key, "transforms."); ok {
		if _, opt, ok := strings.Cut(rest, "."); ok {
			return opt
		}
	}
	return key
}

// New builds a router from Debezium options. Unknown or unsupported options, bad
// regexes and unknown columns are errors.
func New(opts map[string]string) (*Router, error) {
	o := map[string]string{}
	for k, v := range known {
		o[k] = v
	}
	var bad []string
	for k, v := range opts {
		k = strip(k)
		if why := unsupported[k]; why != "" {
			return nil, fmt.Errorf("debezium option %s is not supported (%s)", k, why)
		}
		if _, ok := known[k]; !ok {
			bad = append(bad, k)
			continue
		}
		o[k] = strings.TrimSpace(v)
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return nil, fmt.Errorf("unknown debezium option(s): %s", strings.Join(bad, ", "))
	}
	r := &Router{
		routeBy: o["route.by.field"], replacement: o["route.topic.replacement"],
		idField: o["table.field.event.id"], keyField: o["table.field.event.key"], payloadField: o["table.field.event.payload"],
		traceField: o["tracing.span.context.field"],
	}
	for _, f := range []struct{ opt, col string }{{"route.by.field", r.routeBy}, {"table.field.event.id", r.idField},
		{"table.field.event.payload", r.payloadField}} {
		if err := checkColumn(f.col); err != nil {
			return nil, fmt.Errorf("debezium option %s: %w", f.opt, err)
		}
	}
	if err := checkColumn(r.traceField); err != nil {
		return nil, fmt.Errorf("debezium option tracing.span.context.field: %w", err)
	}
	if r.keyField != "" {
		if err := checkColumn(r.keyField); err != nil {
			return nil, fmt.Errorf("debezium option table.field.event.key: %w", err)
		}
	}
	var err error
	if r.regex, err = javaRegex(o["route.topic.regex"]); err != nil {
		return nil, fmt.Errorf("debezium option route.topic.regex: %w", err)
	}
	for name, v := range map[string]string{"route.tombstone.on.empty.payload": o["route.tombstone.on.empty.payload"],
		"table.expand.json.payload": o["table.expand.json.payload"]} {
		if v != "true" && v != "false" {
			return nil, fmt.Errorf("debezium option %s: want true or false, got %q", name, v)
		}
	}
	r.tombstone = o["route.tombstone.on.empty.payload"] == "true"
	switch o["table.field.additional.missing"] {
	case "error":
	case "ignore":
		r.ignoreMissing = true
	default:
		return nil, fmt.Errorf("debezium option table.field.additional.missing: want error or ignore")
	}
	if p := o["table.fields.additional.placement"]; p != "" {
		for _, item := range strings.Split(p, ",") {
			parts := strings.Split(strings.TrimSpace(item), ":")
			if len(parts) < 2 || len(parts) > 3 {
				return nil, fmt.Errorf("debezium placement %q: want column:header|envelope[:alias]", item)
			}
			for i := range parts {
				parts[i] = strings.TrimSpace(parts[i])
			}
			pl := placement{column: parts[0], alias: parts[0]}
			if len(parts) == 3 {
				pl.alias = parts[2]
			}
			if err := checkColumn(pl.column); err != nil {
				return nil, fmt.Errorf("debezium placement %q: %w", item, err)
			}
			switch parts[1] {
			case "header":
				r.headers = append(r.headers, pl)
			case "envelope":
				r.envelope = append(r.envelope, pl)
			case "partition":
				return nil, fmt.Errorf("debezium placement %q: partition placement is not supported (keys pick partitions)", item)
			default:
				return nil, fmt.Errorf("debezium placement %q: unknown placement %q", item, parts[1])
			}
		}
	}
	return r, nil
}

// javaRegex compiles a Java regex with named groups, matching the whole value as
// Kafka's RegexRouter does (matcher.matches()).
func javaRegex(s string) (*regexp.Regexp, error) {
	if strings.Contains(s, "(?<=") || strings.Contains(s, "(?<!") {
		return nil, fmt.Errorf("lookbehind is not supported")
	}
	return regexp.Compile(`^(?:` + strings.ReplaceAll(s, "(?<", "(?P<") + `)$`)
}

var columns = map[string]bool{"id": true, "aggregatetype": true, "aggregateid": true, "type": true, "payload": true, "tracingspancontext": true}

func checkColumn(c string) error {
	if columns[c] || strings.HasPrefix(c, "headers.") && len(c) > len("headers.") {
		return nil
	}
	return fmt.Errorf("unknown column %q (want id, aggregatetype, aggregateid, type, payload, tracingspancontext or headers.NAME)", c)
}

// value returns a row's column as text, and whether the row has it.
func value(row *outboxdriver.Row, col string) (string, bool) {
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
		return string(row.Payload), !row.PayloadNull
	case "tracingspancontext":
		return row.TraceContext, row.TraceContext != ""
	}
	v, ok := row.Headers[strings.TrimPrefix(col, "headers.")]
	return v, ok
}

// Route returns the message Debezium's router would emit for row. escape (may be nil)
// is applied to the routed-by value, for brokers with a topic syntax of their own. A
// missing additional column is an error unless table.field.additional.missing=ignore.
func (r *Router) Route(row *outboxdriver.Row, escape func(string) string) (broker.Message, error) {
	routed, _ := value(row, r.routeBy)
	if escape != nil {
		routed = escape(routed)
	}
	topic := routed
	if m := r.regex.FindStringSubmatchIndex(routed); m != nil {
		topic = string(r.regex.ExpandString(nil, r.replacement, routed, m))
	}
	id, _ := value(row, r.idField)
	msg := broker.Message{ID: id, Topic: topic}
	if r.keyField != "" {
		msg.Key, _ = value(row, r.keyField)
	}
	payload := row.Payload
	null := row.PayloadNull
	if r.payloadField != "payload" {
		v, ok := value(row, r.payloadField)
		payload, null = []byte(v), !ok
	}
	if len(r.headers) > 0 {
		msg.Headers = make(map[string]string, len(r.headers))
	}
	for _, p := range r.headers {
		v, ok := value(row, p.column)
		if !ok {
			if r.ignoreMissing {
				continue
			}
			return msg, fmt.Errorf("debezium placement: row %s has no %s", row.ID, p.column)
		}
		msg.Headers[p.alias] = v
		msg.HeaderOrder = append(msg.HeaderOrder, p.alias)
	}
	if len(r.envelope) > 0 {
		// A struct {payload, <alias>...} in Debezium's field order: payload first,
		// then the placements as configured.
		var b strings.Builder
		b.WriteString(`{"payload":`)
		switch {
		case null:
			b.WriteString("null")
		case json.Valid(payload):
			b.Write(payload)
		default:
			q, _ := json.Marshal(string(payload))
			b.Write(q)
		}
		for _, p := range r.envelope {
			v, ok := value(row, p.column)
			if !ok {
				if r.ignoreMissing {
					continue
				}
				return msg, fmt.Errorf("debezium placement: row %s has no %s", row.ID, p.column)
			}
			k, _ := json.Marshal(p.alias)
			q, _ := json.Marshal(v)
			b.WriteString("," + string(k) + ":" + string(q))
		}
		b.WriteString("}")
		payload, null = []byte(b.String()), false
	}
	if r.tombstone && (null || strings.TrimSpace(string(payload)) == "") {
		payload, null = nil, true
	}
	msg.Payload, msg.PayloadNull = payload, null
	if tc, _ := value(row, r.traceField); tc != "" {
		for k, v := range broker.TraceHeaders(tc) {
			if msg.Headers == nil {
				msg.Headers = map[string]string{}
			}
			msg.Headers[k] = v
			msg.HeaderOrder = append(msg.HeaderOrder, k)
		}
	}
	return msg, nil
}
