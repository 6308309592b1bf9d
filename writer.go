package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// Writer defaults.
const (
	// NotifyIntervalDefault bounds wake-up notifications to one per interval per
	// writer. A NOTIFY makes PostgreSQL take a database-wide lock at commit, which
	// serialises concurrent commits; see docs/benchmarks.md for what it costs.
	NotifyIntervalDefault = 50 * time.Millisecond
	// MaxHeadersDefault is the most headers one event may carry.
	MaxHeadersDefault = 64
)

// Limits on event fields, checked before anything is written.
const (
	maxAggregateTypeBytes = 255
	maxAggregateIDBytes   = 1024
	maxTypeBytes          = 255
	maxHeaderValueBytes   = 8 << 10
)

// Config configures a Writer. The zero value (or nil) gives the defaults.
type Config struct {
	// NotifyInterval is the least time between two wake-up notifications sent by
	// this writer; writes in between rely on the relay's own polling. Zero means
	// NotifyIntervalDefault; a negative value disables notifications.
	NotifyInterval time.Duration
	// MaxHeaders is the most headers per event. Zero means MaxHeadersDefault.
	MaxHeaders int
	// TraceContext, when set, returns the caller's trace context for ctx as the
	// tracingspancontext column stores it ("traceparent=...\ntracestate=...", Java
	// Properties text as Debezium reads it); the relay continues that trace.
	// outboxotel.TraceContext provides it for OpenTelemetry.
	TraceContext func(ctx context.Context) string
}

// Writer inserts events in the caller's transactions. It is safe for concurrent use.
type Writer[TTx any] struct {
	drv        outboxdriver.Driver[TTx]
	cfg        Config
	jsonColumn bool
	lastNotify atomic.Int64 // unix nanos
	now        func() time.Time
}

// NewWriter returns a writer on drv. It fails on a nil driver or an invalid table.
func NewWriter[TTx any](drv outboxdriver.Driver[TTx], cfg *Config) (*Writer[TTx], error) {
	if any(drv) == nil {
		return nil, ErrNilDriver
	}
	if err := drv.Err(); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	w := &Writer[TTx]{drv: drv, now: time.Now}
	if cfg != nil {
		w.cfg = *cfg
	}
	if w.cfg.NotifyInterval == 0 {
		w.cfg.NotifyInterval = NotifyIntervalDefault
	}
	if w.cfg.MaxHeaders == 0 {
		w.cfg.MaxHeaders = MaxHeadersDefault
	}
	if w.cfg.MaxHeaders < 0 {
		return nil, fmt.Errorf("outbox: MaxHeaders must not be negative, got %d", w.cfg.MaxHeaders)
	}
	w.jsonColumn = drv.Table().Payload == outboxdriver.PayloadJSON
	return w, nil
}

// WriteTx inserts events inside tx, the caller's own transaction, with one statement.
// The events are committed if and only if tx commits: no event of a rolled-back
// transaction is ever published.
//
// Events with an empty ID get a UUIDv7, set in the slice passed in. Every event is
// validated first; if one is invalid, WriteTx returns an error wrapping
// ErrInvalidEvent and writes nothing. WriteTx never begins, commits or rolls back tx.
func (w *Writer[TTx]) WriteTx(ctx context.Context, tx TTx, events ...Event) error {
	return w.write(ctx, w.drv.UnwrapExecutor(tx), events)
}

// Write inserts events on the driver's pool, in a statement of its own. Use it for
// events that go with no business change; anything else belongs in WriteTx.
func (w *Writer[TTx]) Write(ctx context.Context, events ...Event) error {
	exec, err := w.drv.GetExecutor()
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return w.write(ctx, exec, events)
}

func (w *Writer[TTx]) write(ctx context.Context, exec outboxdriver.Executor, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	rows := make([]outboxdriver.InsertEvent, len(events))
	var trace string
	if w.cfg.TraceContext != nil {
		trace = w.cfg.TraceContext(ctx)
	}
	for i := range events {
		if err := w.prepare(i, &events[i], &rows[i]); err != nil {
			return err
		}
		rows[i].TraceContext = trace
	}
	if err := exec.InsertEvents(ctx, &outboxdriver.InsertParams{Events: rows}); err != nil {
		return fmt.Errorf("outbox: insert %d events: %w", len(rows), err)
	}
	if w.shouldNotify() {
		if err := exec.Notify(ctx); err != nil {
			return fmt.Errorf("outbox: notify: %w", err)
		}
	}
	return nil
}

// shouldNotify lets one write per NotifyInterval send a wake-up.
func (w *Writer[TTx]) shouldNotify() bool {
	if w.cfg.NotifyInterval < 0 {
		return false
	}
	now := w.now().UnixNano()
	last := w.lastNotify.Load()
	if now-last < int64(w.cfg.NotifyInterval) {
		return false
	}
	return w.lastNotify.CompareAndSwap(last, now)
}

func (w *Writer[TTx]) prepare(i int, ev *Event, row *outboxdriver.InsertEvent) error {
	bad := func(field, format string, args ...any) error {
		return &EventError{Index: i, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if ev.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("outbox: make event id: %w", err)
		}
		ev.ID = id.String()
	} else {
		id, err := uuid.Parse(ev.ID)
		if err != nil {
			return bad("ID", "%q is not a UUID", ev.ID)
		}
		ev.ID = id.String()
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"AggregateType", ev.AggregateType, maxAggregateTypeBytes},
		{"AggregateID", ev.AggregateID, maxAggregateIDBytes},
		{"Type", ev.Type, maxTypeBytes},
	} {
		if err := checkText(f.v, f.max); err != "" {
			return bad(f.name, "%s", err)
		}
	}
	if w.jsonColumn {
		if len(ev.Payload) == 0 {
			return bad("Payload", "empty; the payload column holds JSON (use a bytes payload column for other data)")
		}
		if !json.Valid(ev.Payload) {
			return bad("Payload", "not valid JSON (the payload column holds JSON; use a bytes payload column for other data)")
		}
		if bytes.Contains(ev.Payload, []byte(`\u0000`)) {
			return bad("Payload", `contains \u0000, which PostgreSQL jsonb cannot store`)
		}
	}
	row.ID, row.AggregateType, row.AggregateID, row.Type, row.Payload = ev.ID, ev.AggregateType, ev.AggregateID, ev.Type, ev.Payload
	row.AvailableAt = ev.NotBefore
	headers := ev.Headers
	if !ev.NotBefore.IsZero() {
		// Its aggregate's later events do not wait for it: consumers must not take its
		// outbox-seq as a version (the inbox's version guard reads this header).
		headers = maps.Clone(ev.Headers)
		if headers == nil {
			headers = map[string]string{}
		}
		headers[wire.HeaderLate] = wire.LateDelayed
	}
	if len(headers) > 0 {
		if len(ev.Headers) > w.cfg.MaxHeaders {
			return bad("Headers", "%d headers, at most %d allowed", len(ev.Headers), w.cfg.MaxHeaders)
		}
		for k, v := range ev.Headers {
			if ReservedHeader(k) {
				return bad("Headers", "%q is reserved by the wire format", k)
			}
			// What every broker can carry (NATS and HTTP header blocks are the
			// strictest): the relay would refuse anything else at publish time.
			if problem := wire.HeaderNameProblem(k); problem != "" {
				return bad("Headers", "name %q: %s", k, problem)
			}
			if problem := wire.HeaderValueProblem(v); problem != "" || len(v) > maxHeaderValueBytes {
				return bad("Headers", "value of %q must be valid UTF-8 without control characters, at most %d bytes", k, maxHeaderValueBytes)
			}
		}
		h, err := json.Marshal(headers)
		if err != nil {
			return bad("Headers", "%v", err)
		}
		row.Headers = h
	}
	return nil
}

func checkText(v string, max int) string {
	switch {
	case v == "":
		return "must not be empty"
	case len(v) > max:
		return fmt.Sprintf("%d bytes, at most %d allowed", len(v), max)
	case !utf8.ValidString(v):
		return "not valid UTF-8"
	case strings.IndexByte(v, 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}

// ReservedHeader reports whether name is set by the relay, by a broker or by a
// CloudEvents binding (in any letter case) and so may not be used in Event.Headers.
func ReservedHeader(name string) bool { return wire.Reserved(name) }
