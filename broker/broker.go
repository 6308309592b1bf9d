// Package broker is the seam between the relay and the message brokers.
//
// A Publisher takes a batch of messages and returns one Result per message, never one
// error for the batch, so the relay can mark exactly what the broker acknowledged.
// Messages of one key must reach the broker in the order given. Every publisher
// decides each message's fate through one engine, Sequence, giving it only how to
// prepare, send and classify a message. Failures are classified with the predicates
// below; the relay's retry policy asks only them.
package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outbox/internal/wire"
)

// Wire-format header names, set on every message (see EachHeader).
const (
	HeaderID            = wire.HeaderID
	HeaderEventType     = wire.HeaderEventType
	HeaderAggregateType = wire.HeaderAggregateType
	HeaderAggregateID   = wire.HeaderAggregateID
	// HeaderPayloadNull is "true" on a message whose payload column was NULL (the
	// body is then empty).
	HeaderPayloadNull = "outbox-payload-null"
	// HeaderSeq is the event's write position, increasing in write order within its
	// aggregate: consumers (the inbox's version guard) skip an event older than one
	// they already applied.
	HeaderSeq = "outbox-seq"
	// HeaderLate ("delayed" or "replayed") marks an event that may arrive after later
	// events of its aggregate, rightly: a delayed event, or a dead letter replayed
	// after its aggregate went on past it. Its outbox-seq is no version to compare.
	HeaderLate = wire.HeaderLate
	// HeaderReplay (the replay's name) marks an event sent again by `outbox replay`.
	HeaderReplay = wire.HeaderReplay
)

// Message is one event as a broker sees it.
type Message struct {
	// ID is the event id, used as the broker's dedup id where it has one.
	ID string
	// DedupID, if set, is the broker's dedup id instead of ID (a replay: its events
	// must not be dropped as repeats of their first delivery, yet an interrupted
	// replay run again must be).
	DedupID string
	// Topic is where the message goes (NATS subject, Kafka topic, routing key...).
	Topic string
	// Key is the ordering and partitioning key (the aggregate id by default).
	Key string
	// EventType, AggregateType and AggregateID travel as the wire-format headers.
	EventType, AggregateType, AggregateID string
	// Payload is the event payload, unchanged.
	Payload []byte
	// PayloadNull marks a NULL payload column (sent as an empty body).
	PayloadNull bool
	// Seq is the event's write position (0: not sent).
	Seq int64
	// Headers are the event's own headers (correlationId, traceparent, ...); may be nil.
	Headers map[string]string
	// HeaderOrder, if set, is the order in which Headers go on the wire.
	HeaderOrder []string
	// Verbatim, set by a router that renders another system's records exactly
	// (debezium.Router), sends the message as built: Headers alone, in HeaderOrder
	// (no wire-format headers), PayloadNull as a null value with no header of its
	// own, and KeyNull as a null key.
	Verbatim bool
	// KeyNull marks a null key (Verbatim messages; Key is then "").
	KeyNull bool
	// ContentType, if set, is the body's media type, for brokers with a slot for it
	// (AMQP's content_type, HTTP's Content-Type, MQTT 5's Content Type); empty: the
	// publisher's own choice.
	ContentType string
	// Timestamp, if set, is the record's time where the broker keeps one (Kafka);
	// zero leaves it to the broker.
	Timestamp time.Time
	// Partition, when HasPartition, is the Kafka partition the record must go to
	// (Debezium's partition placement); other brokers have none and ignore it.
	Partition    int32
	HasPartition bool
}

// DedupKey is the id a broker deduplicates the message by: DedupID, else ID.
func (m *Message) DedupKey() string {
	if m.DedupID != "" {
		return m.DedupID
	}
	return m.ID
}

// MediaType is the body's media type for a broker's content-type slot: ContentType
// when set, else application/json for a JSON payload, else application/octet-stream.
func (m *Message) MediaType() string {
	switch {
	case m.ContentType != "":
		return m.ContentType
	case json.Valid(m.Payload):
		return "application/json"
	}
	return "application/octet-stream"
}

// EachHeader calls fn for every header the message carries on the wire, in a fixed
// order: id, the other wire-format headers the message sets, then the event's own
// headers (in HeaderOrder, else sorted by name). A wire-format header the message sets
// wins over an event header of the same name. Publishers render headers with it, so
// every broker carries the same set.
func (m *Message) EachHeader(fn func(name, value string)) {
	if m.Verbatim {
		for _, k := range m.HeaderOrder {
			if v, ok := m.Headers[k]; ok {
				fn(k, v)
			}
		}
		return
	}
	fn(HeaderID, m.ID)
	if m.EventType != "" {
		fn(HeaderEventType, m.EventType)
	}
	if m.AggregateType != "" {
		fn(HeaderAggregateType, m.AggregateType)
	}
	if m.AggregateID != "" {
		fn(HeaderAggregateID, m.AggregateID)
	}
	if m.PayloadNull {
		fn(HeaderPayloadNull, "true")
	}
	if m.Seq > 0 {
		fn(HeaderSeq, strconv.FormatInt(m.Seq, 10))
	}
	if len(m.Headers) == 0 {
		return
	}
	order := m.HeaderOrder
	if order == nil {
		order = make([]string, 0, len(m.Headers))
		for k := range m.Headers {
			order = append(order, k)
		}
		sort.Strings(order)
	}
	for _, k := range order {
		v, ok := m.Headers[k]
		if !ok || m.setsHeader(k) {
			continue
		}
		fn(k, v)
	}
}

// setsHeader reports whether name is a wire-format header this message sets itself.
func (m *Message) setsHeader(name string) bool {
	switch name {
	case HeaderID:
		return true
	case HeaderEventType:
		return m.EventType != ""
	case HeaderAggregateType:
		return m.AggregateType != ""
	case HeaderAggregateID:
		return m.AggregateID != ""
	case HeaderPayloadNull:
		return m.PayloadNull
	case HeaderSeq:
		return m.Seq > 0
	}
	return false
}

// HeaderCount is how many headers EachHeader yields at most.
func (m *Message) HeaderCount() int { return len(m.Headers) + 6 }

// Result is what happened to one message.
type Result struct {
	// Err is nil when the broker acknowledged the message.
	Err error
}

// Features declare what a publisher can do, so the relay and the conformance suite
// adapt instead of assuming.
type Features struct {
	// BrokerDedup: the broker drops a second message with the same ID.
	BrokerDedup bool
	// PerKeyOrdering: messages of one key are stored in the order given.
	PerKeyOrdering bool
	// Headers: headers are carried.
	Headers bool
	// MaxMessageBytes is the largest payload the broker takes (0: unknown).
	MaxMessageBytes int
}

// Publisher publishes messages.
type Publisher interface {
	// Publish sends msgs in order and waits for the broker's answer to each.
	// len(result) == len(msgs) always.
	Publish(ctx context.Context, msgs []Message) []Result
	// Features describes the publisher.
	Features() Features
	// Close releases what the publisher opened itself (not clients the user passed in).
	Close() error
}

// Ledger is a publisher that keeps, in the broker itself and in one atomic step with
// each batch, the ids of the events it published (Kafka's transactions: the records
// and a progress record commit together). An event it published is never sent again,
// whoever claims its row next: the relay marks it without sending it.
//
// The relay calls Resume whenever it becomes the table's active relay, before it
// publishes, and Marked once the database marks what a batch published. A Ledger runs
// only under a single active relay per table.
type Ledger interface {
	Publisher
	// Resume fences every earlier owner of the ledger (their open batches are aborted
	// and their later ones refused) and returns the ids the broker holds whose rows the
	// database may not mark yet. The relay marks those rows before it publishes.
	Resume(ctx context.Context) ([]string, error)
	// Marked says the database now marks ids as published: the ledger stops carrying
	// them.
	Marked(ids []string)
}

// UnitLedger is a Ledger that opens one ledger of its own per unit of ownership.
// Several active relays of one table (a group) give each lease partition its own, so
// that a partition's new owner fences the producer of the one before it, not just its
// own: a paused owner that lost the partition can no longer publish for it.
type UnitLedger interface {
	Ledger
	// Unit returns a new ledger for the unit (a name such as "p3"). It is not resumed
	// yet; the caller resumes it before it publishes, and closes it.
	Unit(name string) (Ledger, error)
}

// TopicEscaper is implemented by publishers whose topic names have a syntax of their
// own (NATS subjects): the relay escapes every value it puts into a topic template.
type TopicEscaper interface {
	EscapeTopicToken(s string) string
}

// TopicValidator is implemented by publishers that can tell a topic the broker would
// refuse. The relay checks its topic template with it at start (with sample values
// in place of the event's), so a bad template is a configuration error, not a dead
// letter per event.
type TopicValidator interface {
	ValidateTopic(topic string) error
}

// Sentinel errors for classification.
var (
	// ErrPermanent: the broker refused this message and will refuse it again (too
	// large, invalid). Retrying cannot help; it counts as an attempt.
	ErrPermanent = errors.New("message refused permanently")
	// ErrUnavailable: the broker could not be reached. Not the message's fault: it
	// costs no attempt, and the relay backs off the whole publisher.
	ErrUnavailable = errors.New("broker unavailable")
	// ErrDeferred: the message's destination is not ready (no such topic, no queue
	// bound, no stream covering the subject). It is neither the message's fault nor
	// the connection's: the message is retried on its own growing schedule while
	// other topics go on, and is never dead-lettered for it.
	ErrDeferred = errors.New("destination not ready")
	// ErrHeldBack: the message was not sent because an earlier message of its key in
	// the same batch was refused; sending it would break the key's order (or it was
	// sent and failed after such a refusal). It costs no attempt. Sequence decides it.
	ErrHeldBack = errors.New("held back behind a refused message of the same key")
	// ErrFenced: a newer owner of the publisher's ledger took over (another relay
	// resumed it), so this one may publish nothing more until it resumes again. The
	// relay ends its term on it. It costs no attempt.
	ErrFenced = errors.New("fenced by a newer owner")
)

// Permanent wraps err as a permanent failure.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// Unavailable wraps err as a broker-unavailable failure.
func Unavailable(err error) error { return fmt.Errorf("%w: %w", ErrUnavailable, err) }

// IsPermanent reports whether retrying the message cannot succeed.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// Deferred wraps err as a destination that is not ready.
func Deferred(err error) error { return fmt.Errorf("%w: %w", ErrDeferred, err) }

// IsDeferred reports whether the message's destination was not ready.
func IsDeferred(err error) bool { return errors.Is(err, ErrDeferred) }

// IsUnavailable reports whether the failure is the broker's, not the message's.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsFenced reports whether a newer owner fenced the publisher (see ErrFenced).
func IsFenced(err error) bool { return errors.Is(err, ErrFenced) }

// IsHeldBack reports whether the message was held back behind a refused one.
func IsHeldBack(err error) bool { return errors.Is(err, ErrHeldBack) }

// AllUnavailable returns n results that all carry err as a connection failure: for a
// batch that could not be sent at all because the connection is down (no message is
// charged an attempt). A failure of one message must never be spread over a batch
// with it: that is what the per-message results are for.
func AllUnavailable(n int, err error) []Result {
	if !IsUnavailable(err) {
		err = Unavailable(err)
	}
	rs := make([]Result, n)
	for i := range rs {
		rs[i].Err = err
	}
	return rs
}

// RetryAfterError is a refusal that says when the message may be tried again (an
// HTTP Retry-After, a broker's throttle time). The relay waits at least After.
type RetryAfterError struct {
	Err   error
	After time.Duration
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter wraps err with the wait the broker asked for.
func RetryAfter(err error, d time.Duration) error { return &RetryAfterError{Err: err, After: d} }

// RetryAfterOf returns the wait err asks for (0 if none).
func RetryAfterOf(err error) time.Duration {
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return ra.After
	}
	return 0
}

// CheckHeaders refuses, permanently, a message whose headers cannot travel intact on
// a broker with text headers (NATS, HTTP, MQTT): a name that is not a token, a value
// with a control character or invalid UTF-8. The Go writer never writes such a
// header; a plain-SQL producer can. Publishers with such headers call it before
// sending.
func CheckHeaders(m *Message) error {
	var err error
	m.EachHeader(func(k, v string) {
		if err == nil {
			err = CheckHeader(k, v)
		}
	})
	return err
}

// CheckHeader is CheckHeaders for one header, for a publisher that renders and
// checks its headers in one pass.
func CheckHeader(name, value string) error {
	if p := wire.HeaderNameProblem(name); p != "" {
		return Permanent(fmt.Errorf("%s: %q", p, name))
	}
	if p := wire.HeaderValueProblem(value); p != "" {
		return Permanent(fmt.Errorf("header %s: %s", name, p))
	}
	return nil
}

// TraceHeaders reads the traceparent and tracestate entries of a tracingspancontext
// column (Java Properties text, as Debezium stores it); nil when there are none.
func TraceHeaders(tracingSpanContext string) map[string]string {
	if tracingSpanContext == "" {
		return nil
	}
	var out map[string]string
	for _, line := range strings.Split(tracingSpanContext, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		if k = strings.TrimSpace(k); k == "traceparent" || k == "tracestate" {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// EscapeToken percent-encodes the bytes of s that reserved reports (and '%' itself)
// as %XX, and turns an empty s into "_". Publishers whose topics have a syntax of their
// own (NATS subjects, MQTT topics) use it so a value can never change a topic's shape.
func EscapeToken(s string, reserved func(c byte) bool) string {
	if s == "" {
		return "_"
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || reserved(c) {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
