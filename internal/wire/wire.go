// Package wire holds the rules for what a header may carry on every supported broker.
// The writer refuses what breaks them; the publishers refuse (permanently) what a
// plain-SQL producer wrote that breaks them. It is a leaf: it imports only the
// standard library.
package wire

import (
	"strings"
	"unicode/utf8"
)

// The wire format's header names, set by the relay on every message (the root
// package and package broker both export them from here).
const (
	HeaderID            = "id"
	HeaderEventType     = "eventType"
	HeaderAggregateType = "aggregateType"
	HeaderAggregateID   = "aggregateId"
)

// HeaderReplay marks an event sent again by `outbox replay`; its value is the
// replay's name.
const HeaderReplay = "outbox-replay"

// HeaderLate marks an event that may reach consumers after later events of its
// aggregate, rightly: its outbox-seq is no version to compare (the inbox's version
// guard neither skips it nor moves past it). Its value says why.
const (
	HeaderLate = "outbox-late"
	// LateDelayed: written with a delay (Event.NotBefore); its aggregate's later
	// events do not wait for it.
	LateDelayed = "delayed"
	// LateReplayed: a dead letter replayed after its aggregate's later events went on
	// past it (--flow-past-dead-letters).
	LateReplayed = "replayed"
	// LateCommitted: its transaction committed after a later event of its aggregate
	// was published (writers that did not serialize the aggregate's transactions, so
	// commit order differs from write order). The relay that published the later
	// event marks it.
	LateCommitted = "committed-late"
)

// MaxHeaderNameBytes is the longest header name every broker carries (an AMQP table
// key is a short string).
const MaxHeaderNameBytes = 255

// HeaderNameProblem says why name cannot be a header name on every broker ("" when
// it can): it must be an HTTP token (RFC 9110 tchar: letters, digits and
// !#$%&'*+-.^_`|~), 1 to MaxHeaderNameBytes bytes. A space, a colon or a control
// character would break the NATS and HTTP header blocks.
func HeaderNameProblem(name string) string {
	if name == "" {
		return "empty header name"
	}
	if len(name) > MaxHeaderNameBytes {
		return "header name longer than 255 bytes"
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return "header name may hold only letters, digits and !#$%&'*+-.^_`|~"
		}
	}
	return ""
}

// HeaderValueProblem says why value cannot be a header value on every broker ("" when
// it can): valid UTF-8 without control characters (a tab is allowed). A newline would
// end a NATS or HTTP header early and forge the next one.
func HeaderValueProblem(value string) string {
	if !utf8.ValidString(value) {
		return "header value is not valid UTF-8"
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return "header value holds a control character"
		}
	}
	return ""
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// Reserved reports whether a header name is set by the relay, by a broker or by a
// CloudEvents binding, in any letter case: a row's header of that name could pass
// for the relay's own (an Outbox-Seq that a version guard believes, a Ce-Source that
// replaces the event's source). The writer refuses such names; the relay drops them
// from rows written by plain SQL (RowHeaderAllowed keeps the one the project itself
// stores).
func Reserved(name string) bool {
	l := strings.ToLower(name)
	switch l {
	case "id", "eventtype", "aggregatetype", "aggregateid", "traceparent", "tracestate":
		return true
	}
	for _, p := range []string{"nats-", "outbox-", "x-death", "webhook-", "kafka_", "ce-", "ce_", "cloudevents_", "cloudevents:"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

// RowHeaderAllowed reports whether a stored row may carry a header of this name: any
// name that is not Reserved, and HeaderLate exactly as the writer and the drivers
// store it (a delayed event, a replayed dead letter).
func RowHeaderAllowed(name string) bool { return name == HeaderLate || !Reserved(name) }
