package debezium_test

import (
	"encoding/json"
	"testing"

	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/outboxdriver"
)

// FuzzRouter: any option values either build a router or are refused; a router routes
// any row without panicking, its id header is always the row's id, and under the JSON
// converters its key and value are valid JSON.
func FuzzRouter(f *testing.F) {
	f.Add("(?<routedByValue>.*)", "outbox.event.${routedByValue}", "type:header:eventType", "Order", `{"a":1}`, true, "json")
	f.Add("(?<a>x)(", "$1${b}", "aggregatetype:envelope", "", "", false, "string")
	f.Add(".*", "${routedByValue}", "headers.tenant:header:t,payload:envelope:p", "a.b", "not json", true, "json-schemas")
	f.Add("(.)(.)(.)", `$12\$$3`, "type:envelope:t", "abc", `[{"a":[]},{"a":[{"b":null}]}]`, true, "json")
	f.Fuzz(func(t *testing.T, regex, replacement, placement, aggType, payload string, expand bool, conv string) {
		classes := map[string]string{"string": "org.apache.kafka.connect.storage.StringConverter",
			"json": "org.apache.kafka.connect.json.JsonConverter", "json-schemas": "org.apache.kafka.connect.json.JsonConverter"}
		opts := map[string]string{
			"route.topic.regex": regex, "route.topic.replacement": replacement,
			"table.fields.additional.placement": placement, "table.field.additional.missing": "ignore",
			"value.converter": classes[conv], "key.converter": classes[conv],
			"value.converter.schemas.enable": map[bool]string{true: "true", false: "false"}[conv == "json-schemas"],
		}
		if expand {
			opts["table.expand.json.payload"] = "true"
		}
		r, err := debezium.New(&debezium.Config{Options: opts})
		if err != nil {
			return
		}
		row := &outboxdriver.Row{ID: "e1", AggregateType: aggType, AggregateID: "k", Type: "T", Payload: []byte(payload),
			Headers: map[string]string{"tenant": "acme"}}
		m, err := r.Route(row, nil)
		if err != nil {
			t.Fatalf("route with missing=ignore: %v", err)
		}
		var id string
		m.EachHeader(func(k, v string) {
			if k == "id" {
				id = v
			}
		})
		if id != "e1" {
			t.Fatalf("id header %q", id)
		}
		if conv != "string" && classes[conv] != "" {
			if !m.PayloadNull && !json.Valid(m.Payload) {
				t.Fatalf("%s value is not JSON: %s", conv, m.Payload)
			}
			if !m.KeyNull && !json.Valid([]byte(m.Key)) {
				t.Fatalf("%s key is not JSON: %s", conv, m.Key)
			}
		}
	})
}
