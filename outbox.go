// Package outbox is a transactional outbox for Go services.
//
// A service writes its business rows and its events in ONE local database transaction:
//
//	tx, _ := pool.Begin(ctx)
//	// ... the business change on tx ...
//	err := w.WriteTx(ctx, tx, outbox.Event{
//		AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
//		Payload: []byte(`{"id":42,"total":"9.90"}`),
//	})
//	_ = tx.Commit(ctx)
//
// The events exist if and only if the transaction commits. A relay (package relay, or
// the `outbox relay` command) then publishes committed events to a broker, at least
// once, in order per aggregate, with the event id as the broker's dedup id.
//
// The writer is generic over the driver's transaction type, so pgx.Tx (outboxpgx) and
// *sql.Tx (outboxsql) both work without adapter code.
package outbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outbox/internal/wire"
)

// Event is one fact a service tells the rest of the system about.
type Event struct {
	// ID identifies the event for its whole life and is the consumers' dedup key.
	// Empty means the writer makes a UUIDv7 (time-ordered) and sets it.
	ID string
	// AggregateType routes the event: "order" goes to topic outbox.event.order.
	AggregateType string
	// AggregateID is the message key; order holds per (AggregateType, AggregateID).
	AggregateID string
	// Type is the event type, e.g. "OrderPlaced".
	Type string
	// Payload is the event contract, published unchanged. It must be valid JSON for a
	// JSON payload column (the default).
	Payload []byte
	// Headers travel as broker headers. Names reserved by the wire format (see
	// ReservedHeader) are refused.
	Headers map[string]string
	// NotBefore delays the event: the relay publishes it no earlier than this. Zero
	// means as soon as the transaction commits. A delayed event does not hold back
	// later events of its aggregate: it is ordered by the time it becomes due.
	NotBefore time.Time
}

// Header names of the wire format. The relay sets the first four on every message;
// the others are conventions for metadata that applications put in Event.Headers.
const (
	HeaderID            = wire.HeaderID
	HeaderEventType     = wire.HeaderEventType
	HeaderAggregateType = wire.HeaderAggregateType
	HeaderAggregateID   = wire.HeaderAggregateID

	HeaderCorrelationID = "correlationId"
	HeaderCausationID   = "causationId"
	HeaderTenantID      = "tenantId"
	HeaderEventVersion  = "eventVersion"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrInvalidEvent wraps every validation failure of an event; nothing was written.
	ErrInvalidEvent = errors.New("invalid outbox event")
	// ErrNilDriver is returned by NewWriter for a nil driver.
	ErrNilDriver = errors.New("outbox: driver is nil")
)

// EventError says which event of a write is invalid and why.
type EventError struct {
	Index  int    // position in the Write call
	Field  string // "Payload", "AggregateID", ...
	Reason string
}

func (e *EventError) Error() string {
	return fmt.Sprintf("outbox: event %d: %s: %s", e.Index, e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidEvent) true.
func (e *EventError) Unwrap() error { return ErrInvalidEvent }
