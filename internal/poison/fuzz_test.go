package poison_test

import (
	"bufio"
	"bytes"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/mqtt"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/outboxdriver"
)

// FuzzRowToWire: whatever a stored row holds, each publisher's checks either refuse
// the message permanently or pass a message its broker carries intact: NATS and HTTP
// header blocks that read back to the same headers (no forged line), a literal NATS
// subject, an MQTT topic of valid UTF-8 without wildcards, a legal Kafka topic, AMQP
// short strings. Never a panic.
func FuzzRowToWire(f *testing.F) {
	f.Add("order", "42", "OrderPlaced", `{"correlationId":"c"}`, "")
	f.Add("or.der *>", "a\nb", "T\r\nx", `{"bad name":"x"}`, "traceparent=x")
	f.Add("\xff", "", "", `[1]`, "\x00")
	f.Add("a/+/#", "\x1b]0;x\x07", "T", `{"h":"a\r\nforged: 1"}`, "")
	f.Fuzz(func(t *testing.T, aggregateType, aggregateID, typ, headers, trace string) {
		row := outboxdriver.Row{ID: "0190c0de-0000-7000-8000-000000000000", AggregateType: aggregateType, AggregateID: aggregateID,
			Type: typ, Payload: []byte(`{}`), Headers: outboxdriver.ParseHeaders([]byte(headers)), TraceContext: trace}
		h := row.Headers
		if tc := broker.TraceHeaders(row.TraceContext); tc != nil {
			h = map[string]string{}
			for k, v := range row.Headers {
				h[k] = v
			}
			for k, v := range tc {
				h[k] = v
			}
		}
		tmpl, err := broker.ParseTemplate(broker.TopicTemplateDefault)
		if err != nil {
			t.Fatal(err)
		}
		msg := func(esc func(string) string) broker.Message {
			return broker.Message{ID: row.ID, Key: row.AggregateID, EventType: row.Type, AggregateType: row.AggregateType,
				AggregateID: row.AggregateID, Payload: row.Payload, Headers: h,
				Topic: tmpl.Execute(broker.TopicFields{AggregateType: row.AggregateType, Type: row.Type}, esc)}
		}
		headersOK := broker.CheckHeaders(&broker.Message{ID: row.ID, EventType: row.Type, AggregateType: row.AggregateType,
			AggregateID: row.AggregateID, Headers: h}) == nil

		// NATS: a checked message's header block reads back to the same headers, and
		// its (escaped) subject is literal.
		m := msg(natspub.EscapeToken)
		if err := natspub.ValidateSubject(m.Topic); err != nil {
			t.Fatalf("escaped subject %q refused: %v", m.Topic, err)
		}
		if headersOK {
			want := http.Header{}
			m.EachHeader(func(k, v string) { want[k] = append(want[k], v) })
			var block bytes.Buffer
			block.WriteString("NATS/1.0\r\n")
			for k, vs := range want {
				for _, v := range vs {
					block.WriteString(k + ": " + v + "\r\n")
				}
			}
			block.WriteString("\r\n")
			r := textproto.NewReader(bufio.NewReader(&block))
			_, _ = r.ReadLine()
			got, err := r.ReadMIMEHeader()
			if err != nil {
				t.Fatalf("checked headers do not parse back: %v", err)
			}
			for k, vs := range want {
				for i, v := range vs {
					if g := got.Values(k); len(g) <= i || g[i] != strings.TrimSpace(v) && g[i] != v {
						t.Fatalf("header %q: sent %q, read back %q", k, v, g)
					}
				}
			}
			// HTTP (webhook): every name and value is one net/http sends.
			for k, vs := range want {
				if !httpguts.ValidHeaderFieldName(k) {
					t.Fatalf("checked header name %q is not valid HTTP", k)
				}
				for _, v := range vs {
					if !httpguts.ValidHeaderFieldValue(v) {
						t.Fatalf("checked header value %q is not valid HTTP", v)
					}
				}
			}
		}
		// MQTT: an escaped topic is valid unless the value was not UTF-8 (then the
		// publisher refuses the message permanently).
		if m := msg(mqtt.EscapeToken); mqtt.ValidateTopic(m.Topic) != nil && utf8.ValidString(row.AggregateType) {
			t.Fatalf("escaped MQTT topic %q of a UTF-8 aggregate type refused", m.Topic)
		}
		// Kafka and AMQP: the checks never panic and say no to what the broker would.
		m = msg(nil)
		if kafka.ValidateTopic(m.Topic) == nil && (len(m.Topic) > 249 || strings.ContainsAny(m.Topic, " /*\x00")) {
			t.Fatalf("Kafka topic %q accepted", m.Topic)
		}
		if amqp.ValidateTopic(m.Topic) == nil && len(m.Topic) > 255 {
			t.Fatalf("AMQP routing key of %d bytes accepted", len(m.Topic))
		}
	})
}
