package debezium_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/outboxdriver"
)

// The expectations of Debezium's own router tests, as records. Each case names the
// test of io.debezium.transforms.outbox.EventRouterTest (or of Kafka's RegexRouter,
// or the router's documentation) it reproduces; the expectations are those tests'
// assertions written as the bytes the configured converter puts on the wire. The
// cases marked e2e also run end to end (golden_test.go): PostgreSQL, relay in poll
// and CDC mode, Kafka (kfake).

// The row of EventRouterTest.createEventRecord().
const (
	dbzID      = "da8d6de6-3b77-45ff-8f44-57db55a7a06c"
	dbzType    = "UserCreated"
	dbzAggID   = "10711fa5"
	dbzAggType = "User"
)

// record is what a Kafka consumer sees; nil key or value is a Kafka null.
type record struct {
	topic   string
	key     *string
	headers string // k=v;... in order
	value   *string
}

func (r record) String() string {
	show := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}
	return "topic=" + r.topic + " key=" + show(r.key) + " headers=[" + r.headers + "] value=" + show(r.value)
}

func (r record) equal(o record) bool {
	same := func(a, b *string) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
	return r.topic == o.topic && r.headers == o.headers && same(r.key, o.key) && same(r.value, o.value)
}

func p(s string) *string { return &s }

type routerCase struct {
	test    string // the Debezium (or Kafka) test it reproduces
	opts    map[string]string
	aggType string  // default dbzAggType
	payload *string // default "{}"; nil payloadNull
	null    bool    // payload NULL
	want    record
	e2e     bool // also relayed from PostgreSQL (payload written in jsonb's own form)
}

// converters are the connector lines of each converter.
var converters = map[string]map[string]string{
	"string": {},
	"json": {"key.converter": "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable": "false",
		"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false"},
	"json-schemas": {"key.converter": "org.apache.kafka.connect.json.JsonConverter",
		"value.converter": "org.apache.kafka.connect.json.JsonConverter", "topic.prefix": "dbserver1"},
}

func with(conv string, opts map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range converters[conv] {
		out[k] = v
	}
	for k, v := range opts {
		out[k] = v
	}
	return out
}

const (
	jsonKeySchema     = `{"type":"string","optional":false}`
	jsonPayloadSchema = `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`
	defaultTopic      = "outbox.event." + dbzAggType
	idHeader          = "id=" + dbzID
)

func routerCases(schemaName string) []routerCase {
	envelopeSchema := func(fields string) string {
		return `{"type":"struct","fields":[` + jsonPayloadSchema[:len(jsonPayloadSchema)-1] + `,"field":"payload"}` + fields +
			`],"optional":false,"name":"dbserver1.` + schemaName + `.outbox.User.Value"}`
	}
	expanded := func(opts map[string]string) map[string]string {
		opts = with("json", opts)
		opts["table.expand.json.payload"] = "true"
		return opts
	}
	return []routerCase{
		{test: "canExtractTableFields, canSetDefaultMessageKey, canPassStringKey", e2e: true,
			want: record{topic: defaultTopic, key: p(dbzAggID), headers: idHeader, value: p("{}")}},
		{test: "canExtractTableFields (JsonConverter, schemas off)", opts: with("json", nil), e2e: true,
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`"{}"`)}},
		{test: "canExtractTableFields (JsonConverter, schemas on)", opts: with("json-schemas", nil), e2e: true,
			want: record{topic: defaultTopic, key: p(`{"schema":` + jsonKeySchema + `,"payload":"` + dbzAggID + `"}`), headers: idHeader,
				value: p(`{"schema":` + jsonPayloadSchema + `,"payload":"{}"}`)}},
		{test: "canSetMessageKey", opts: map[string]string{"table.field.event.key": "type"}, e2e: true,
			want: record{topic: defaultTopic, key: p(dbzType), headers: idHeader, value: p("{}")}},
		{test: "canRouteBasedOnField", opts: map[string]string{"route.by.field": "aggregatetype"}, aggType: "Address", e2e: true,
			want: record{topic: "outbox.event.Address", key: p(dbzAggID), headers: idHeader, value: p("{}")}},
		{test: "canSetPayloadTypeIntoTheEnvelope (StringConverter: Struct.toString)",
			opts: map[string]string{"table.fields.additional.placement": "type:envelope"}, e2e: true,
			want: record{topic: defaultTopic, key: p(dbzAggID), headers: idHeader, value: p("Struct{payload={},type=UserCreated}")}},
		{test: "canSetPayloadTypeIntoTheEnvelope (JsonConverter: payload a string)",
			opts: with("json", map[string]string{"table.fields.additional.placement": "type:envelope"}), e2e: true,
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"payload":"{}","type":"UserCreated"}`)}},
		{test: "canSetPayloadTypeIntoTheEnvelope (JsonConverter, schemas on)",
			opts: with("json-schemas", map[string]string{"table.fields.additional.placement": "type:envelope"}), e2e: true,
			want: record{topic: defaultTopic, key: p(`{"schema":` + jsonKeySchema + `,"payload":"` + dbzAggID + `"}`), headers: idHeader,
				value: p(`{"schema":` + envelopeSchema(`,{"type":"string","optional":false,"field":"type"}`) + `,"payload":{"payload":"{}","type":"UserCreated"}}`)}},
		{test: "canSetPayloadTypeIntoTheEnvelopeWithAlias",
			opts: with("json", map[string]string{"table.fields.additional.placement": "type:envelope:aggregateType"}),
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"payload":"{}","aggregateType":"UserCreated"}`)}},
		{test: "canSetMultipleFieldsIntoTheEnvelope",
			opts: with("json", map[string]string{"table.fields.additional.placement": "type:envelope:payloadType, aggregateid:envelope:payloadId,type:header:payloadType"}), e2e: true,
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader + ";payloadType=UserCreated",
				value: p(`{"payload":"{}","payloadType":"UserCreated","payloadId":"10711fa5"}`)}},
		{test: "canMarkAnEventAsDeleted (emptiness is the raw payload's, not the envelope's)",
			opts:    with("json", map[string]string{"table.fields.additional.placement": "type:envelope:eventType", "route.tombstone.on.empty.payload": "true"}),
			payload: p(""),
			want:    record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader}},
		{test: "canMarkAnEventAsDeleted (a NULL payload column)",
			opts: with("json", map[string]string{"table.fields.additional.placement": "type:envelope:eventType", "route.tombstone.on.empty.payload": "true"}),
			null: true, e2e: true,
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader}},
		{test: "noTombstoneIfNotConfigured",
			opts:    with("json", map[string]string{"table.fields.additional.placement": "type:envelope:eventType"}),
			payload: p(""),
			want:    record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"payload":"","eventType":"UserCreated"}`)}},
		{test: "noTombstoneIfNotConfigured (a NULL payload column)",
			opts: with("json", map[string]string{"table.fields.additional.placement": "type:envelope:eventType"}), null: true, e2e: true,
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"payload":null,"eventType":"UserCreated"}`)}},
		{test: "documentation: route.tombstone.on.empty.payload (whitespace is empty)",
			opts: map[string]string{"route.tombstone.on.empty.payload": "true"}, payload: p(" \t\n"),
			want: record{topic: defaultTopic, key: p(dbzAggID), headers: idHeader}},
		{test: "documentation: a NULL payload without tombstones (JsonConverter writes null)", opts: with("json", nil), null: true, e2e: true,
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p("null")}},
		{test: "canExpandJsonPayloadIfConfigured", opts: expanded(nil), e2e: true,
			payload: p(`{"age": 42, "pets": ["dog", "cat"], "rating": 4.9, "enabled": true, "fullName": "John Doe", "petObjects": [{"type": "dog"}, {"type": "cat"}]}`),
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader,
				value: p(`{"age":42,"pets":["dog","cat"],"rating":4.9,"enabled":true,"fullName":"John Doe","petObjects":[{"type":"dog"},{"type":"cat"}]}`)}},
		{test: "canExpandJsonWithNestedArraysWhereFirstArrayIsEmpty", opts: expanded(nil), e2e: true,
			payload: p(`{"fullName": "John Doe", "petObjects": [{"type": "dog", "colors": []}, {"type": "cat", "colors": [{"name": "white"}]}]}`),
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader,
				value: p(`{"fullName":"John Doe","petObjects":[{"type":"dog","colors":[]},{"type":"cat","colors":[{"name":"white"}]}]}`)}},
		{test: "shouldExpandJSONPayloadWithEmptyArrayAndRemoveThatArray", opts: expanded(nil), e2e: true,
			payload: p(`{"fullName": "John Doe", "petObjects": [{"type": "dog", "colors": []}]}`),
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader,
				value: p(`{"fullName":"John Doe","petObjects":[{"type":"dog"}]}`)}},
		{test: "table.json.payload.empty.array.behavior=optional_string keeps the array",
			opts:    expanded(map[string]string{"table.json.payload.empty.array.behavior": "optional_string"}),
			payload: p(`{"fullName": "John Doe", "petObjects": [{"type": "dog", "colors": []}]}`),
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader,
				value: p(`{"fullName":"John Doe","petObjects":[{"type":"dog","colors":[]}]}`)}},
		{test: "shouldNotExpandJSONPayloadIfNotConfigured", opts: with("json", nil),
			payload: p(`{"fullName": "John Doe", "rating": 4.9, "age": 42}`),
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader,
				value: p(`"{\"fullName\": \"John Doe\", \"rating\": 4.9, \"age\": 42}"`)}},
		{test: "canExpandJsonPayloadWithAdditionalFieldInEnvelope",
			opts: expanded(map[string]string{"table.fields.additional.placement": "type:envelope"}), payload: p(`{"fullName": "John Doe"}`), e2e: true,
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"payload":{"fullName":"John Doe"},"type":"UserCreated"}`)}},
		{test: "canExpandJsonArrayWithFirstElementNull", opts: expanded(nil), e2e: true,
			payload: p(`{"numbers": [null, 2, 3], "fullName": "John Doe"}`),
			want:    record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"numbers":[null,2,3],"fullName":"John Doe"}`)}},
		{test: "canExpandJsonArrayWithComplexElements (null fields dropped)", opts: expanded(nil),
			payload: p(`{"id":"1028cbab-c55b-4dab-a367-7d9471466a59","attributes":[{"id":"10911586","adr":null,"eans":[{"code":"2007000013656","createdAt":"2022-06-08T11:33:16.465Z"}],"purchaseBusinessStatus":"BLOCOM","isCanBeReturnToSupplier":false,"purchaseWarehouseStatus":"NONAUT"}]}`),
			want: record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader,
				value: p(`{"id":"1028cbab-c55b-4dab-a367-7d9471466a59","attributes":[{"id":"10911586","eans":[{"code":"2007000013656","createdAt":"2022-06-08T11:33:16.465Z"}],"purchaseBusinessStatus":"BLOCOM","isCanBeReturnToSupplier":false,"purchaseWarehouseStatus":"NONAUT"}]}`)}},
		{test: "table.json.payload.null.behavior=optional_bytes keeps null fields",
			opts:    expanded(map[string]string{"table.json.payload.null.behavior": "optional_bytes"}),
			payload: p(`{"id":"1","adr":null}`),
			want:    record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"id":"1","adr":null}`)}},
		{test: "expansion of a payload that is not JSON keeps the string (Debezium logs a warning)", opts: expanded(nil),
			payload: p(`{"a": 1`),
			want:    record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`"{\"a\": 1"`)}},
		{test: "expansion reads the first JSON value, as Jackson's readTree (trailing text is not read)", opts: expanded(nil),
			payload: p(`{"a": 1} trailing`),
			want:    record{topic: defaultTopic, key: p(`"` + dbzAggID + `"`), headers: idHeader, value: p(`{"a":1}`)}},
		{test: "RegexRouter: Java replacement syntax ($1, then literal text)",
			opts: map[string]string{"route.topic.regex": "(.*)", "route.topic.replacement": "outbox.$1_events"}, e2e: true,
			want: record{topic: "outbox.User_events", key: p(dbzAggID), headers: idHeader, value: p("{}")}},
		{test: "RegexRouter: $12 with one group is group 1 then the digit 2 (Java's rule)",
			opts: map[string]string{"route.topic.regex": "(.*)", "route.topic.replacement": "$12"},
			want: record{topic: "User2", key: p(dbzAggID), headers: idHeader, value: p("{}")}},
		{test: `RegexRouter: \$ is a literal dollar, ${name} a named group`,
			opts: map[string]string{"route.topic.regex": "(?<agg>U)(?<rest>.*)", "route.topic.replacement": `x\$${rest}.${agg}`},
			want: record{topic: "x$ser.U", key: p(dbzAggID), headers: idHeader, value: p("{}")}},
		{test: "RegexRouter: no match keeps the routed value",
			opts: map[string]string{"route.topic.regex": "nomatch-(?<routedByValue>.*)"},
			want: record{topic: dbzAggType, key: p(dbzAggID), headers: idHeader, value: p("{}")}},
		{test: "documentation: table.field.event.key empty gives a null key", opts: map[string]string{"table.field.event.key": ""}, e2e: true,
			want: record{topic: defaultTopic, headers: idHeader, value: p("{}")}},
		{test: "documentation: a connector config pasted whole (Kafka Connect properties)",
			opts: map[string]string{
				"name": "outbox-connector", "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
				"database.hostname": "db", "plugin.name": "pgoutput", "table.include.list": "public.outbox", "topic.prefix": "dbserver1",
				"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
				"transforms.outbox.table.fields.additional.placement": "type:header:eventType",
				"transforms.outbox.route.topic.replacement":           "${routedByValue}.events",
				"value.converter": "org.apache.kafka.connect.storage.StringConverter",
			}, e2e: true,
			want: record{topic: "User.events", key: p(dbzAggID), headers: idHeader + ";eventType=UserCreated", value: p("{}")}},
		{test: "documentation: a Debezium Server config (JSON with schemas unless debezium.format says otherwise)",
			opts: map[string]string{
				"debezium.sink.type": "kafka", "debezium.source.connector.class": "io.debezium.connector.postgresql.PostgresConnector",
				"debezium.source.topic.prefix": "dbserver1", "debezium.transforms": "outbox",
				"debezium.transforms.outbox.type":      "io.debezium.transforms.outbox.EventRouter",
				"debezium.format.value.schemas.enable": "false", "debezium.format.key": "simplestring",
			},
			want: record{topic: defaultTopic, key: p(dbzAggID), headers: idHeader, value: p(`"{}"`)}},
	}
}

func routeRow(aggType string, payload *string, null bool) *outboxdriver.Row {
	row := &outboxdriver.Row{ID: dbzID, AggregateType: dbzAggType, AggregateID: dbzAggID, Type: dbzType, Payload: []byte("{}")}
	if aggType != "" {
		row.AggregateType = aggType
	}
	if payload != nil {
		row.Payload = []byte(*payload)
	}
	if null {
		row.Payload, row.PayloadNull = nil, true
	}
	return row
}

// TestEventRouter routes each case's row and compares the record, byte for byte.
func TestEventRouter(t *testing.T) {
	t.Parallel()
	for _, tc := range routerCases("public") {
		t.Run(tc.test, func(t *testing.T) {
			r, err := debezium.New(&debezium.Config{Options: tc.opts, Table: outboxdriver.Table{Schema: "public", Name: "outbox"}})
			if err != nil {
				t.Fatal(err)
			}
			m, err := r.Route(routeRow(tc.aggType, tc.payload, tc.null), nil)
			if err != nil {
				t.Fatal(err)
			}
			got := record{topic: m.Topic}
			if !m.KeyNull {
				got.key = p(m.Key)
			}
			if !m.PayloadNull {
				got.value = p(string(m.Payload))
			}
			var hs []string
			m.EachHeader(func(k, v string) { hs = append(hs, k+"="+v) })
			got.headers = strings.Join(hs, ";")
			if !got.equal(tc.want) {
				t.Fatalf("record:\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

// outboxColumns are the columns of a table outbox migrate made.
var outboxColumns = []debezium.Column{{"id", "uuid", true}, {"aggregatetype", "text", true}, {"aggregateid", "text", true},
	{"type", "text", true}, {"payload", "jsonb", false}, {"headers", "jsonb", false}, {"tracingspancontext", "text", false},
	{"seq", "bigint", true}, {"created_at", "timestamp with time zone", true},
	{"total", "numeric", false}, {"tenant", "text", false}}

// TestRefusedAtStart: what Debezium's configuration refuses, and what this router
// cannot reproduce, stops the relay at start with the option named.
func TestRefusedAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		test string
		opts map[string]string
		want string
	}{
		{"shouldFailOnInvalidConfigurationForTopicRegex", map[string]string{"route.topic.regex": " [[a-z]**"}, "route.topic.regex"},
		{"issue: [[a-z] is invalid in Java, valid in Go", map[string]string{"route.topic.regex": "[[a-z]"}, "route.topic.regex"},
		{"shouldFailOnInvalidConfigurationForAdditionalFields", map[string]string{"table.fields.additional.placement": "type"}, "placement"},
		{"shouldFailOnInvalidConfigurationForAdditionalFieldsEmpty", map[string]string{"table.fields.additional.placement": ""}, "placement"},
		{"shouldFailOnInvalidConfigurationForOperationBehavior", map[string]string{"table.op.invalid.behavior": "invalidOption"}, "table.op.invalid.behavior"},
		{"failsOnInvalidSetMessageKey (Debezium fails on the first record; here at start)", map[string]string{"table.field.event.key": "fakefield"}, "fakefield"},
		{"unknown expand behaviour", map[string]string{"table.json.payload.null.behavior": "drop"}, "null.behavior"},
		{"a replacement naming no group", map[string]string{"route.topic.replacement": "x.${nope}"}, "no group with name"},
		{"a replacement naming a group number past the last", map[string]string{"route.topic.replacement": "x.$2"}, "no group 2"},
		{"a Java group name with an underscore", map[string]string{"route.topic.regex": "(?<routed_by>.*)"}, "group name"},
		{"lookbehind", map[string]string{"route.topic.regex": "(?<=x)y"}, "lookaround"},
		{"Go's U flag is Java's UNICODE_CHARACTER_CLASS", map[string]string{"route.topic.regex": "(?U)a*"}, "inline flag"},
		{"possessive quantifier", map[string]string{"route.topic.regex": "a*+"}, "possessive"},
		{"an unescaped { that is no quantifier", map[string]string{"route.topic.regex": "a{x}"}, "illegal repetition"},
		{"class intersection", map[string]string{"route.topic.regex": "[a-z&&[^x]]"}, "route.topic.regex"},
		{"tombstone value", map[string]string{"route.tombstone.on.empty.payload": "yes"}, "true or false"},
		{"missing behaviour", map[string]string{"table.field.additional.missing": "skip"}, "missing"},
		{"unknown option", map[string]string{"route.no.such": "x"}, "route.no.such"},
		{"another transform in the chain", map[string]string{"transforms": "outbox,unwrap", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
			"transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"}, "unwrap"},
		{"a column of a type the router cannot render", map[string]string{"table.fields.additional.placement": "total:envelope"}, "numeric"},
		{"a partition column that is no integer", map[string]string{"table.fields.additional.placement": "tenant:partition"}, "not an integer"},
		{"a schema version column that is no integer", map[string]string{"table.field.event.schema.version": "tenant"}, "schema.version"},
		{"an event time column that is no time", map[string]string{"table.field.event.timestamp": "tenant"}, "event.timestamp"},
		{"Avro converter", map[string]string{"transforms.outbox.route.by.field": "type", "value.converter": "io.confluent.connect.avro.AvroConverter"}, "AvroConverter"},
	} {
		t.Run(tc.test, func(t *testing.T) {
			_, err := debezium.New(&debezium.Config{Options: tc.opts, TableColumns: outboxColumns})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestBytesPayload reproduces canPassBinaryMessage: a bytea payload is sent as its
// bytes.
func TestBytesPayload(t *testing.T) {
	t.Parallel()
	r, err := debezium.New(&debezium.Config{Table: outboxdriver.Table{Payload: outboxdriver.PayloadBytes}})
	if err != nil {
		t.Fatal(err)
	}
	row := routeRow("", nil, false)
	row.Payload = []byte("a binary message\x00\xff")
	m, err := r.Route(row, nil)
	if err != nil || string(m.Payload) != "a binary message\x00\xff" {
		t.Fatalf("%q, %v", m.Payload, err)
	}
}

func TestIgnoredConnectorKeys(t *testing.T) {
	t.Parallel()
	r, err := debezium.New(&debezium.Config{Options: map[string]string{
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
		"database.hostname": "db", "slot.name": "debezium", "transforms.outbox.predicate": "isOutbox",
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Ignored(), ","); got != "database.hostname,slot.name,transforms.outbox.predicate" {
		t.Fatalf("ignored: %s", got)
	}
	if debezium.Enabled(map[string]string{"database.hostname": "db"}) || !debezium.Enabled(map[string]string{"transforms.x.route.by.field": "type"}) {
		t.Fatal("Enabled")
	}
}

// TestMissingAdditionalColumn: a placement naming a column the table lacks stops the
// relay at start by default (Debezium throws on every record); ignored (Debezium's
// table.fields.additional.error.on.missing=false, or table.field.additional.missing=ignore),
// the placement is skipped, reported once, and the other placements still apply.
func TestMissingAdditionalColumn(t *testing.T) {
	t.Parallel()
	const placement = "nosuch:header,tenant:header:t,gone:envelope"
	_, err := debezium.New(&debezium.Config{Options: map[string]string{"table.fields.additional.placement": placement}, TableColumns: outboxColumns})
	if err == nil || !strings.Contains(err.Error(), "nosuch") && !strings.Contains(err.Error(), "gone") {
		t.Fatalf("a missing column by default: %v, want an error naming it", err)
	}
	for _, opt := range [][2]string{{"table.fields.additional.error.on.missing", "false"}, {"table.field.additional.missing", "ignore"}} {
		t.Run(opt[0], func(t *testing.T) {
			r, err := debezium.New(&debezium.Config{Options: map[string]string{"table.fields.additional.placement": placement, opt[0]: opt[1]},
				TableColumns: outboxColumns})
			if err != nil {
				t.Fatal(err)
			}
			if cols := r.Columns(); !slices.Equal(cols, []string{"tenant"}) {
				t.Fatalf("columns read with each row: %v, want only tenant", cols)
			}
			if ig := strings.Join(r.Ignored(), "; "); !strings.Contains(ig, "nosuch:header") || !strings.Contains(ig, "gone:envelope") {
				t.Fatalf("the skipped placements are not reported: %q", ig)
			}
			row := routeRow("", nil, false)
			row.Columns = map[string]outboxdriver.Value{"tenant": {Type: "text", V: "acme"}}
			m, err := r.Route(row, nil)
			if err != nil || m.Headers["t"] != "acme" || string(m.Payload) != "{}" {
				t.Fatalf("routed: %+v, %v (want header t and the bare payload: no envelope field is left)", m, err)
			}
		})
	}
}
