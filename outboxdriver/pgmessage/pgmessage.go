// Package pgmessage is the table-less CDC mode's message format: the content of the
// pg_logical_emit_message each event is written as. The writer (the PostgreSQL
// drivers) encodes it and the CDC relay (package pgcdc) decodes it; it is a leaf, so
// neither side imports the other.
package pgmessage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxd/outbox/outboxdriver"
)

// The table-less mode writes each event as one transactional logical decoding
// message, pg_logical_emit_message(true, prefix, content), and no row at all. The
// content is a one-line JSON object with the event's metadata, a newline, then the
// payload bytes exactly as published:
//
//	{"id":"…","aggregatetype":"order","aggregateid":"42","type":"OrderPlaced","headers":{…},"tracingspancontext":"…"}\n<payload>
//
// "headers", "tracingspancontext", "created_at" (RFC 3339; default: the commit
// time), "available_at" (a delayed event) and "seq" are optional. "seq" is the
// event's order number, drawn from the outbox table's own sequence as a row's is, so
// the outbox-seq header increases in write order whatever the write mode (default:
// the message's WAL position, which is not comparable with rows' numbers);
// "payload_null": true marks a NULL payload (the bytes after the newline are then
// empty). Any language can emit it:
//
//	SELECT pg_logical_emit_message(true, 'public.outbox',
//	    convert_to(json_build_object('id', gen_random_uuid(), 'aggregatetype', 'order',
//	        'aggregateid', '42', 'type', 'OrderPlaced',
//	        'seq', nextval(pg_get_serial_sequence('public.outbox', 'seq')))::text || E'\n', 'UTF8')
//	    || convert_to('{"total": 10}', 'UTF8'));
type messageHeader struct {
	ID            string            `json:"id"`
	AggregateType string            `json:"aggregatetype"`
	AggregateID   string            `json:"aggregateid"`
	Type          string            `json:"type"`
	Headers       map[string]string `json:"headers,omitempty"`
	TraceContext  string            `json:"tracingspancontext,omitempty"`
	CreatedAt     *time.Time        `json:"created_at,omitempty"`
	PayloadNull   bool              `json:"payload_null,omitempty"`
	AvailableAt   *time.Time        `json:"available_at,omitempty"`
	Seq           int64             `json:"seq,omitempty"`
}

// PrefixDefault returns the logical message prefix of a table's events:
// its qualified name, so several outboxes in one database stay apart.
func PrefixDefault(t outboxdriver.Table) string { return t.WithDefaults().String() }

// Encode returns the logical message content of one event.
func Encode(ev *outboxdriver.InsertEvent) ([]byte, error) {
	h := messageHeader{ID: ev.ID, AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Type: ev.Type,
		TraceContext: ev.TraceContext, PayloadNull: ev.Payload == nil}
	if !ev.AvailableAt.IsZero() {
		h.AvailableAt = &ev.AvailableAt
	}
	if ev.Headers != nil {
		if err := json.Unmarshal(ev.Headers, &h.Headers); err != nil {
			return nil, fmt.Errorf("pgcdc: headers: %w", err)
		}
	}
	var b bytes.Buffer
	b.Grow(len(ev.Payload) + 160)
	if err := json.NewEncoder(&b).Encode(&h); err != nil { // Encode ends the line
		return nil, fmt.Errorf("pgcdc: %w", err)
	}
	b.Write(ev.Payload)
	return b.Bytes(), nil
}

// Decode reads the content of a table-less event and when it may go out
// (zero: now). The payload aliases content.
func Decode(content []byte) (outboxdriver.Row, time.Time, error) {
	line, payload, ok := bytes.Cut(content, []byte{'\n'})
	if !ok {
		return outboxdriver.Row{}, time.Time{}, errors.New("outbox message: no newline after the JSON header")
	}
	var h messageHeader
	if !h.parseSimple(line) {
		h = messageHeader{}
		if err := json.Unmarshal(line, &h); err != nil {
			return outboxdriver.Row{}, time.Time{}, fmt.Errorf("outbox message header: %w", err)
		}
	}
	id, err := uuid.Parse(h.ID)
	if err != nil {
		return outboxdriver.Row{}, time.Time{}, fmt.Errorf("outbox message id %q: %w", h.ID, err)
	}
	if h.AggregateType == "" || h.AggregateID == "" || h.Type == "" {
		return outboxdriver.Row{}, time.Time{}, errors.New("outbox message lacks aggregatetype, aggregateid or type")
	}
	r := outboxdriver.Row{ID: id.String(), AggregateType: h.AggregateType, AggregateID: h.AggregateID, Type: h.Type,
		Headers: h.Headers, TraceContext: h.TraceContext, Payload: payload, PayloadNull: h.PayloadNull}
	if h.PayloadNull {
		r.Payload = nil
	}
	if h.CreatedAt != nil {
		r.CreatedAt = *h.CreatedAt
	}
	if h.Seq > 0 {
		r.Seq = h.Seq
	}
	var at time.Time
	if h.AvailableAt != nil {
		at = *h.AvailableAt
	}
	return r, at, nil
}

// parseSimple reads the header the writer produces (known keys, strings without
// escapes, a flat headers object) without reflection: encoding/json was a fifth of the
// relay's CPU in the table-less mode. Anything else (escapes, unknown keys, odd
// values, invalid text) returns false and goes to encoding/json, so the result is
// always what json.Unmarshal gives (FuzzMessageHeader checks it).
func (h *messageHeader) parseSimple(b []byte) bool {
	p := simpleParser{b: b}
	if !p.byte('{') {
		return false
	}
	if p.byte('}') {
		return p.end()
	}
	for {
		key, ok := p.str()
		if !ok || !p.byte(':') {
			return false
		}
		switch key {
		case "id", "aggregatetype", "aggregateid", "type", "tracingspancontext":
			v, ok := p.str()
			if !ok {
				return false
			}
			switch key {
			case "id":
				h.ID = v
			case "aggregatetype":
				h.AggregateType = v
			case "aggregateid":
				h.AggregateID = v
			case "type":
				h.Type = v
			default:
				h.TraceContext = v
			}
		case "created_at", "available_at":
			v, ok := p.str()
			if !ok {
				return false
			}
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return false
			}
			if key == "created_at" {
				h.CreatedAt = &t
			} else {
				h.AvailableAt = &t
			}
		case "seq":
			n, ok := p.uint()
			if !ok {
				return false
			}
			h.Seq = n
		case "payload_null":
			switch {
			case p.lit("true"):
				h.PayloadNull = true
			case p.lit("false"):
				h.PayloadNull = false
			default:
				return false
			}
		case "headers":
			if !p.byte('{') {
				return false
			}
			if h.Headers == nil { // a repeated key merges, as in encoding/json
				h.Headers = map[string]string{}
			}
			if !p.byte('}') {
				for {
					k, ok := p.str()
					if !ok || !p.byte(':') {
						return false
					}
					v, ok := p.str()
					if !ok {
						return false
					}
					h.Headers[k] = v
					if p.byte('}') {
						break
					}
					if !p.byte(',') {
						return false
					}
				}
			}
		default:
			return false
		}
		if p.byte('}') {
			return p.end()
		}
		if !p.byte(',') {
			return false
		}
	}
}

type simpleParser struct {
	b []byte
	i int
}

func (p *simpleParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\r' || p.b[p.i] == '\n') {
		p.i++
	}
}

func (p *simpleParser) byte(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *simpleParser) lit(s string) bool {
	p.space()
	if bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		p.i += len(s)
		return true
	}
	return false
}

// uint reads a JSON integer of at most 18 digits, without sign, fraction or
// exponent (anything else goes to encoding/json).
func (p *simpleParser) uint() (int64, bool) {
	p.space()
	start := p.i
	var n int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		n = n*10 + int64(p.b[p.i]-'0')
		p.i++
	}
	digits := p.i - start
	if digits == 0 || digits > 18 || (digits > 1 && p.b[start] == '0') {
		return 0, false
	}
	if p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return 0, false
	}
	return n, true
}

func (p *simpleParser) end() bool {
	p.space()
	return p.i == len(p.b)
}

// str reads a string with no escapes, control characters or invalid UTF-8.
func (p *simpleParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	ascii := true
	for ; p.i < len(p.b); p.i++ {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			if !ascii && !utf8.Valid(s) {
				return "", false
			}
			return string(s), true
		case c == '\\' || c < 0x20:
			return "", false
		case c >= 0x80:
			ascii = false
		}
	}
	return "", false
}
