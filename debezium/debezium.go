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
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

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
	// TableColumns, when set, describes the table's columns: their types and
	// nullability make the schemas JsonConverter writes exact, and a custom column
	// the options name that is not among them is refused at start (else the claim
	// fails). Without it, the columns outbox migrate creates are assumed.
	TableColumns []Column
}

// Column describes one column of the outbox table.
type Column struct {
	Name    string
	Type    string // as format_type(atttypid, NULL) names it: "jsonb", "character varying", ...
	NotNull bool
}

// defaultColumns are the columns of a table outbox migrate creates, by name.
var defaultColumns = map[string]Column{
	"id": {"id", "uuid", true}, "aggregatetype": {"aggregatetype", "text", true}, "aggregateid": {"aggregateid", "text", true},
	"type": {"type", "text", true}, "payload": {"payload", "jsonb", false}, "tracingspancontext": {"tracingspancontext", "text", false},
}

// Router turns rows into the records Debezium would emit. Build it with New.
type Router struct {
	routeBy, idField, keyField, payloadField, traceField string
	topics                                               *regexRouter
	tombstone, ignoreMissing                             bool
	headers, envelope, partition                         []placement
	timestampField, versionField                         string
	custom                                               map[string]bool // custom columns the options name
	columns                                              map[string]Column
	expand                                               *expander // nil: off
	keyConv, valueConv                                   Converter
	bytesPayload                                         bool
	schemaPrefix                                         string // "<topic.prefix>.<schema>.<table>."
	ignored                                              []string

	mu            sync.Mutex
	envelopeNamed map[int]string // the value schema's name per version, fixed by the first record as in Debezium
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
		tombstone: strings.EqualFold(o["route.tombstone.on.empty.payload"], "true"),
		ignoreMissing: strings.EqualFold(o["table.field.additional.missing"], "ignore") ||
			strings.EqualFold(o["table.fields.additional.error.on.missing"], "false"),
		keyConv: c.key, valueConv: c.value, bytesPayload: t.Payload == outboxdriver.PayloadBytes,
		ignored:      c.ignored,
		schemaPrefix: t.Schema + "." + t.Name + ".",
	}
	if c.prefix != "" {
		r.schemaPrefix = c.prefix + "." + r.schemaPrefix
	}
	for _, f := range []struct{ opt, col string }{{"route.by.field", r.routeBy}, {"table.field.event.id", r.idField},
		{"table.field.event.payload", r.payloadField}, {"tracing.span.context.field", r.traceField}} {
		if err := r.checkColumn(f.col); err != nil {
			return nil, fmt.Errorf("debezium: router option %s: %w", f.opt, err)
		}
	}
	if r.keyField != "" {
		if err := r.checkColumn(r.keyField); err != nil {
			return nil, fmt.Errorf("debezium: router option table.field.event.key: %w", err)
		}
	}
	r.timestampField, r.versionField = o["table.field.event.timestamp"], o["table.field.event.schema.version"]
	for _, col := range []string{r.timestampField, r.versionField} {
		if col != "" {
			_ = r.checkColumn(col)
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
			if err := r.checkColumn(pl.column); err != nil {
				return nil, fmt.Errorf("debezium: placement %s:%s: %w", pl.column, pl.where, err)
			}
			switch pl.where {
			case "header":
				r.headers = append(r.headers, pl)
			case "envelope":
				r.envelope = append(r.envelope, pl)
			case "partition":
				r.partition = append(r.partition, pl)
			}
		}
	}
	r.columns = defaultColumns
	if r.bytesPayload {
		r.columns = maps.Clone(defaultColumns)
		r.columns["payload"] = Column{"payload", "bytea", false}
	}
	if cfg.TableColumns != nil {
		r.columns = map[string]Column{}
		for _, c := range cfg.TableColumns {
			r.columns[c.Name] = c
		}
		if r.ignoreMissing {
			r.skipAbsentPlacements()
		}
		for _, c := range r.Columns() {
			col, ok := r.columns[c]
			if !ok {
				return nil, fmt.Errorf("debezium: the options name column %q, which table %s does not have", c, t)
			}
			// A type the router cannot render would fail every row: refuse it now.
			if _, err := schemaFor(col.Type, true); err != nil {
				return nil, fmt.Errorf("debezium: column %s: %w", c, err)
			}
		}
		integer := map[string]bool{"smallint": true, "integer": true, "bigint": true}
		for _, chk := range []struct {
			opt, col string
			ok       func(typ string) bool
		}{
			{"table.field.event.timestamp", r.timestampField, func(typ string) bool {
				return integer[typ] || strings.HasPrefix(typ, "timestamp") || typ == "date"
			}},
			{"table.field.event.schema.version", r.versionField, func(typ string) bool { return integer[typ] }},
		} {
			if chk.col != "" && !ownColumns[chk.col] && !chk.ok(r.columns[chk.col].Type) {
				return nil, fmt.Errorf("debezium: router option %s: column %s is %s", chk.opt, chk.col, r.columns[chk.col].Type)
			}
		}
		for _, pl := range r.partition {
			if !ownColumns[pl.column] && !integer[r.columns[pl.column].Type] {
				return nil, fmt.Errorf("debezium: placement %s:partition: column %s is %s, not an integer", pl.column, pl.column, r.columns[pl.column].Type)
			}
		}
	}
	for name := range ownColumns {
		c, ok := r.columns[name]
		if !ok {
			return nil, fmt.Errorf("debezium: table %s has no column %s", t, name)
		}
		if _, err := schemaFor(c.Type, !c.NotNull); err != nil {
			return nil, fmt.Errorf("debezium: column %s: %w", name, err)
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

// skipAbsentPlacements drops the placements of columns the table does not have, as
// Debezium skips them on every record under table.field.additional.missing=ignore;
// Ignored reports each. Columns the other options name stay required.
func (r *Router) skipAbsentPlacements() {
	absent := func(p placement) bool {
		_, ok := r.columns[p.column]
		return !ok && !ownColumns[p.column] && !strings.HasPrefix(p.column, "headers.")
	}
	for _, list := range []*[]placement{&r.headers, &r.envelope, &r.partition} {
		*list = slices.DeleteFunc(*list, func(p placement) bool {
			if !absent(p) {
				return false
			}
			r.ignored = append(r.ignored, fmt.Sprintf("table.fields.additional.placement %s:%s (the table has no column %s)", p.column, p.where, p.column))
			return true
		})
	}
	required := []string{r.routeBy, r.idField, r.keyField, r.payloadField, r.traceField, r.timestampField, r.versionField}
	for c := range r.custom {
		if _, ok := r.columns[c]; !ok && !slices.Contains(required, c) && !r.placed(c) {
			delete(r.custom, c) // named by skipped placements only
		}
	}
}

// placed reports whether a placement names column c.
func (r *Router) placed(c string) bool {
	for _, list := range [][]placement{r.headers, r.envelope, r.partition} {
		for _, p := range list {
			if p.column == c {
				return true
			}
		}
	}
	return false
}

// Ignored lists the keys of the config that change nothing here (the connector's
// own settings: connection, slot, snapshot, ...), for the caller to report once.
func (r *Router) Ignored() []string { return r.ignored }

// ownColumns are the outbox table's columns a router option may name; any other
// name is a custom column of the table (read with the row: Columns).
var ownColumns = map[string]bool{"id": true, "aggregatetype": true, "aggregateid": true, "type": true, "payload": true, "tracingspancontext": true}

// checkColumn accepts a column of the outbox table, headers.NAME, or a custom column
// (which it records).
func (r *Router) checkColumn(c string) error {
	switch {
	case ownColumns[c]:
	case strings.HasPrefix(c, "headers."):
		if c == "headers." {
			return fmt.Errorf("headers. needs a key name")
		}
	case c == "":
		return fmt.Errorf("a column name is required")
	default:
		if r.custom == nil {
			r.custom = map[string]bool{}
		}
		r.custom[c] = true
	}
	return nil
}

// Columns lists the custom columns the options name, for the relay to read with
// each row (relay.ColumnRouter).
func (r *Router) Columns() []string {
	out := make([]string, 0, len(r.custom))
	for c := range r.custom {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// column returns a row's column as Debezium's PostgreSQL connector would see it: its
// Connect schema and value, and whether the row has it (a headers.NAME whose key is
// absent, or a custom column the row lacks, has not).
func (r *Router) column(row *outboxdriver.Row, col string) (*schema, any, bool, error) {
	var v any
	switch col {
	case "id":
		v = row.ID
	case "aggregatetype":
		v = row.AggregateType
	case "aggregateid":
		v = row.AggregateID
	case "type":
		v = row.Type
	case "payload":
		if !row.PayloadNull {
			v = string(row.Payload)
			if r.columns["payload"].Type == "bytea" {
				v = row.Payload
			}
		}
	case "tracingspancontext":
		if row.TraceContext != "" {
			v = row.TraceContext
		}
	}
	if ownColumns[col] {
		info := r.columns[col]
		s, _ := schemaFor(info.Type, !info.NotNull) // checked by New
		return s, v, true, nil
	}
	if name, ok := strings.CutPrefix(col, "headers."); ok {
		v, ok := row.Headers[name]
		return optionalStringSchema, v, ok, nil
	}
	cv, ok := row.Columns[col]
	if !ok {
		return nil, nil, false, nil
	}
	s, out, err := connectValue(cv, !r.columns[col].NotNull)
	if err != nil {
		return nil, nil, true, fmt.Errorf("column %s: %w", col, err)
	}
	return s, out, true, nil
}

// Route returns the record Debezium's router and the configured converters would
// emit for row. escape (may be nil) is applied to the routed-by value, for brokers
// with a topic syntax of their own. A missing additional column is an error unless
// table.field.additional.missing=ignore; a missing id, key, payload, routing or
// timestamp column is an error, as in Debezium.
func (r *Router) Route(row *outboxdriver.Row, escape func(string) string) (broker.Message, error) {
	var msg broker.Message
	need := func(col string) (*schema, any, error) {
		s, v, ok, err := r.column(row, col)
		if err == nil && !ok {
			err = fmt.Errorf("row %s has no column %s", row.ID, col)
		}
		return s, v, err
	}
	_, rv, err := need(r.routeBy)
	if err != nil {
		return msg, fmt.Errorf("debezium route.by.field: %w", err)
	}
	routed := ""
	if rv != nil {
		routed = javaString(rv)
	}
	if escape != nil {
		routed = escape(routed)
	}
	_, id, err := need(r.idField)
	if err != nil {
		return msg, fmt.Errorf("debezium table.field.event.id: %w", err)
	}
	msg = broker.Message{ID: javaString(id), Topic: r.topics.topic(routed), Verbatim: true, KeyNull: true}
	if r.keyField != "" {
		ks, kv, err := need(r.keyField)
		if err != nil {
			return msg, fmt.Errorf("debezium table.field.event.key: %w", err)
		}
		k, ok := r.keyConv.convert(ks, kv)
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
	// placed returns a placement's column; ok is false for a missing one that
	// table.field.additional.missing=ignore skips.
	placed := func(p placement) (*schema, any, bool, error) {
		s, v, ok, err := r.column(row, p.column)
		if err == nil && !ok && !r.ignoreMissing {
			err = fmt.Errorf("debezium placement: row %s has no column %s", row.ID, p.column)
		}
		return s, v, ok, err
	}
	for _, p := range r.headers {
		_, v, ok, err := placed(p)
		if err != nil {
			return msg, err
		}
		if !ok {
			continue
		}
		if v == nil {
			v = "" // a null header value: carried as empty
		}
		addHeader(p.alias, javaString(v))
	}
	for _, p := range r.partition {
		_, v, ok, err := placed(p)
		if err != nil {
			return msg, err
		}
		if n, isInt := v.(int64); ok && isInt {
			msg.Partition, msg.HasPartition = int32(n), true
		} else if ok {
			return msg, fmt.Errorf("debezium placement %s:partition: row %s: want an integer, got %v", p.column, row.ID, v)
		}
	}
	if r.timestampField != "" {
		ts, err := r.timestamp(row)
		if err != nil {
			return msg, err
		}
		msg.Timestamp = ts
	}

	payloadSchema, payload, err := need(r.payloadField)
	if err != nil {
		return msg, fmt.Errorf("debezium table.field.event.payload: %w", err)
	}
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
		env, err := r.envelopeValue(row, routed, payloadSchema, payload, placed)
		if err != nil {
			return msg, err
		}
		valueSchema, value = env.schema, env
	}
	b, ok := r.valueConv.convert(valueSchema, value)
	msg.Payload, msg.PayloadNull = b, !ok

	if _, tc, _, _ := r.column(row, r.traceField); tc != nil {
		for k, v := range broker.TraceHeaders(javaString(tc)) {
			addHeader(k, v)
		}
	}
	return msg, nil
}

// timestamp is the record timestamp from table.field.event.timestamp: a timestamp
// column (Debezium's MicroTimestamp), an epoch-millisecond integer, or zero (the
// broker's time) for NULL. A timestamptz column, which Debezium refuses
// (ZonedTimestamp), is taken as the instant it holds.
func (r *Router) timestamp(row *outboxdriver.Row) (time.Time, error) {
	v, ok := row.Columns[r.timestampField]
	if !ok {
		return time.Time{}, fmt.Errorf("debezium table.field.event.timestamp: row %s has no column %s", row.ID, r.timestampField)
	}
	switch t := v.V.(type) {
	case nil:
		return time.Time{}, nil
	case time.Time:
		return t, nil
	case int64:
		return time.UnixMilli(t), nil
	}
	return time.Time{}, fmt.Errorf("debezium table.field.event.timestamp: column %s of type %s is no timestamp", r.timestampField, v.Type)
}

// envelopeValue is the struct {payload, <alias>...} of envelope placements, its
// schema versioned by table.field.event.schema.version.
func (r *Router) envelopeValue(row *outboxdriver.Row, routed string, payloadSchema *schema, payload any,
	placed func(placement) (*schema, any, bool, error)) (*structValue, error) {
	version := 0
	if r.versionField != "" {
		vv := row.Columns[r.versionField]
		n, ok := vv.V.(int64)
		if !ok {
			return nil, fmt.Errorf("debezium table.field.event.schema.version: row %s: column %s is no integer", row.ID, r.versionField)
		}
		version = int(n)
	}
	s := &schema{typ: "struct", name: r.envelopeName(routed, version), version: version, fields: []field{{"payload", payloadSchema}}}
	v := &structValue{schema: s, values: []any{payload}}
	for _, p := range r.envelope {
		ps, pv, ok, err := placed(p)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		s.fields = append(s.fields, field{p.alias, ps})
		v.values = append(v.values, pv)
	}
	return v, nil
}

// envelopeName is the value schema's name: the table's record name with the routed
// value before its last part ("<prefix>.<schema>.<table>.<routed>.Value"). Debezium
// caches the schema it builds for the first record of each schema version, so
// every later record of that version carries the first one's name; so does this
// router, from its start.
func (r *Router) envelopeName(routed string, version int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.envelopeNamed == nil {
		r.envelopeNamed = map[int]string{}
	}
	name, ok := r.envelopeNamed[version]
	if !ok {
		name = r.schemaPrefix + routed + ".Value"
		r.envelopeNamed[version] = name
	}
	return name
}
