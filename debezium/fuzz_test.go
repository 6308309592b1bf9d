package debezium_test

import (
	"testing"

	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/outboxdriver"
)

// FuzzRouter: any option values either build a router or are refused; a router routes
// any row without panicking, and its id header is always the row's id.
func FuzzRouter(f *testing.F) {
	f.Add("(?<routedByValue>.*)", "outbox.event.${routedByValue}", "type:header:eventType", "Order", `{"a":1}`)
	f.Add("(?<a>x)(", "$1${b}", "aggregatetype:envelope", "", "")
	f.Add(".*", "${routedByValue}", "headers.tenant:header:t,payload:envelope:p", "a.b", "not json")
	f.Fuzz(func(t *testing.T, regex, replacement, placement, aggType, payload string) {
		r, err := debezium.New(map[string]string{
			"route.topic.regex": regex, "route.topic.replacement": replacement,
			"table.fields.additional.placement": placement, "table.field.additional.missing": "ignore",
		})
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
	})
}
