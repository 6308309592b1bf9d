package broker_test

import (
	"testing"

	"github.com/outboxd/outbox/broker"
)

// FuzzParseTemplate: any template either parses or is refused with an error; a parsed
// one renders any value without panicking, and escapes every value it places.
func FuzzParseTemplate(f *testing.F) {
	for _, s := range []string{broker.TopicTemplateDefault, "${type}", "a.${routedByValue}.b", "${", "${nope}", "", "x${aggregatetype}${type}"} {
		f.Add(s, "order")
	}
	f.Fuzz(func(t *testing.T, tmpl, value string) {
		p, err := broker.ParseTemplate(tmpl)
		if err != nil {
			return
		}
		// With an escaper that ignores its input, the value cannot show: every value
		// renders the same topic.
		esc := func(string) string { return "X" }
		a := p.Execute(broker.TopicFields{AggregateType: value, Type: value}, esc)
		b := p.Execute(broker.TopicFields{AggregateType: value + "?", Type: "other"}, esc)
		if a != b {
			t.Fatalf("template %q placed a raw value: %q vs %q", tmpl, a, b)
		}
	})
}

// FuzzTraceHeaders: any tracingspancontext text is read without panicking and yields
// only traceparent and tracestate.
func FuzzTraceHeaders(f *testing.F) {
	f.Add("traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=a=b")
	f.Add("=\n==\nfoo")
	f.Fuzz(func(t *testing.T, s string) {
		for k := range broker.TraceHeaders(s) {
			if k != "traceparent" && k != "tracestate" {
				t.Fatalf("unexpected key %q", k)
			}
		}
	})
}

// FuzzEscapeToken: an escaped value never contains a reserved byte, and distinct
// values stay distinct.
func FuzzEscapeToken(f *testing.F) {
	f.Add("order", "a.b")
	f.Add("", "%")
	f.Add("x y*>", "x%20y")
	reserved := func(c byte) bool { return c == '.' || c == '*' || c == '>' || c <= ' ' }
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := broker.EscapeToken(a, reserved), broker.EscapeToken(b, reserved)
		for i := 0; i < len(ea); i++ {
			if reserved(ea[i]) {
				t.Fatalf("EscapeToken(%q) = %q keeps a reserved byte", a, ea)
			}
		}
		if a != b && ea == eb && a != "" && b != "" {
			t.Fatalf("%q and %q both escape to %q", a, b, ea)
		}
	})
}
