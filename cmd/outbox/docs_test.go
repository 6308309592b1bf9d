package main

import (
	"os"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/mqtt"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/redis"
	"github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/broker/webhook"
)

// TestBrokerTableMatchesCode reads docs/relay.md's broker table and the paragraphs
// after it, and checks that every name the publishers put on the wire (header, field,
// property, topic shape, escaping) is what the code uses: the table a consumer team
// builds on cannot drift from the code.
func TestBrokerTableMatchesCode(t *testing.T) {
	b, err := os.ReadFile("../../docs/relay.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	row := func(scheme string) string {
		for _, line := range strings.Split(doc, "\n") {
			if strings.HasPrefix(line, "| `"+scheme+"://") || strings.HasPrefix(line, "| `"+scheme+":") {
				return line
			}
		}
		t.Fatalf("docs/relay.md has no broker table row for %s", scheme)
		return ""
	}
	topic := func(tmpl string) string { return strings.ReplaceAll(tmpl, "${aggregatetype}", "<aggregatetype>") }
	code := func(s string) string { return "`" + s + "`" }
	for scheme, names := range map[string][]string{
		"nats":  {code(topic(broker.TopicTemplateDefault)), code(natspub.HeaderKey), code(jetstream.MsgIDHeader)},
		"kafka": {strings.TrimPrefix(kafka.Compressions, "none, ")},
		"amqp":  {code(amqp.ExchangeDefault), code(amqp.HeaderKey), "`message_id`", "`type`", "`content_type`"},
		"redis": {"fields " + strings.Join([]string{redis.FieldID, redis.FieldKey, redis.FieldType, redis.FieldHeaders, redis.FieldPayload}, ", ")},
		"mqtt":  {code(topic(mqtt.TopicTemplateDefault)), code(mqtt.HeaderKey)},
		"sqs":   {code(topic(sqs.TopicTemplateDefault)), code(sqs.HeaderPacked), code(sqs.HeaderBodyEncoding)},
		"https": {code(webhook.HeaderID), code(webhook.HeaderTimestamp), code(webhook.HeaderSignature), code(webhook.HeaderKey), code(webhook.HeaderTopic), "`Content-Type`"},
	} {
		r := row(scheme)
		for _, n := range names {
			if !strings.Contains(r, n) {
				t.Errorf("the %s row of docs/relay.md does not say %s (the code's name):\n%s", scheme, n, r)
			}
		}
	}
	// Every header the wire format sets is named.
	m := broker.Message{ID: "x", EventType: "T", AggregateType: "A", AggregateID: "1", Seq: 1, PayloadNull: true}
	m.EachHeader(func(name, _ string) {
		if !strings.Contains(doc, code(name)) {
			t.Errorf("docs/relay.md does not name the wire-format header %s", code(name))
		}
	})
	for _, name := range []string{broker.HeaderLate} {
		if !strings.Contains(doc, code(name)) {
			t.Errorf("docs/relay.md does not name the header %s", code(name))
		}
	}
	// The escaping examples are what the escapers do.
	for _, ex := range []string{
		code("order.v2") + " → " + code("outbox.event."+natspub.EscapeToken("order.v2")),
		code("eu/orders") + " → " + code("outbox/event/"+mqtt.EscapeToken("eu/orders")),
	} {
		if !strings.Contains(doc, ex) {
			t.Errorf("docs/relay.md lacks the escaping example %s (what the code does)", ex)
		}
	}
}
