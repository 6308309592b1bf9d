// Package outboxdriver is the database seam between outbox (writer and relay) and a
// concrete database driver.
//
// It is internal and unstable: its interfaces change whenever the writer or the relay
// need something new. Applications use the driver packages' constructors
// (outboxpgx.New, outboxsql.New, ...) and hand the result to outbox.NewWriter or
// relay.New; they never call these methods themselves.
//
// Every method takes a context and, where it needs more than one argument, a *Params
// struct. Native database errors are translated to the sentinels below in one function
// per driver, so the relay branches on them without knowing the database.
package outboxdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Sentinel errors shared by all drivers.
var (
	// ErrNoPool is returned by methods that need a pool when the driver was built
	// around a transaction only.
	ErrNoPool = errors.New("outboxdriver: driver has no connection pool")
	// ErrTableMissing means the outbox table does not exist: run the migrations.
	ErrTableMissing = errors.New("outbox table does not exist (run `outbox migrate`)")
	// ErrDuplicateID means an event with the same id is already in the outbox.
	ErrDuplicateID = errors.New("an event with this id already exists")
	// ErrNotSupported is returned for a capability the driver does not have.
	ErrNotSupported = errors.New("outboxdriver: not supported by this driver")
	// ErrLeadershipLost means the relay's leadership session ended.
	ErrLeadershipLost = errors.New("relay leadership lost")
	// ErrNeedsOperator wraps errors a relay cannot get past by retrying (a lost
	// replication slot, a server without logical decoding): the relay stops with it.
	ErrNeedsOperator = errors.New("an operator must act")
	// ErrEventNotFound means no table holds an event with that id: never written,
	// rolled back, cleaned up after publication, or purged from the dead letters.
	ErrEventNotFound = errors.New("no event with this id")
	// ErrNotCompleted means a claim's write-back, settled in a fresh transaction
	// after the claim's own ended, left rows the broker took unpublished: another
	// session held them (SKIP LOCKED), or recorded on them since. They are published
	// again; a transactional publisher's ledger must keep them as sent, so it answers
	// them without sending (docs/kafka.md).
	ErrNotCompleted = errors.New("rows the broker took were left unpublished")
)

// Driver is one database binding, generic over the transaction type the caller uses
// (pgx.Tx, *sql.Tx) so the writer needs no adapter code.
type Driver[TTx any] interface {
	// Name identifies the driver in logs and errors ("pgx", "database/sql", ...).
	Name() string
	// Table returns the outbox table this driver reads and writes.
	Table() Table
	// Err reports a configuration error found when the driver was built (an
	// invalid table name); every other method fails with it too.
	Err() error
	// UnwrapExecutor returns an executor whose statements run inside tx.
	UnwrapExecutor(tx TTx) Executor
	// GetExecutor returns an executor running on the driver's pool, or ErrNoPool.
	GetExecutor() (Executor, error)
	// Store returns the relay side of the driver, or ErrNoPool.
	Store() (Store, error)
	// Migrator returns the schema migrator, or ErrNoPool.
	Migrator() (Migrator, error)
}

// Executor runs the writer's statements, either in a caller's transaction or on a pool.
type Executor interface {
	// InsertEvents inserts all events with one statement.
	InsertEvents(ctx context.Context, params *InsertParams) error
	// Notify wakes listening relays; it is only a hint. Drivers without
	// LISTEN/NOTIFY return nil without doing anything.
	Notify(ctx context.Context) error
}

// InsertParams are the events to insert. Every field is already validated.
type InsertParams struct {
	Events []InsertEvent
}

// InsertEvent is one row to insert.
type InsertEvent struct {
	ID            string // canonical UUID text
	AggregateType string
	AggregateID   string
	Type          string
	Payload       []byte
	Headers       []byte    // JSON object text, nil for none
	AvailableAt   time.Time // zero: now; later: a delayed event
	TraceContext  string    // tracingspancontext: "traceparent=...\ntracestate=...", "" for none
}

// Row is one outbox row as the relay reads it.
type Row struct {
	Seq           int64
	ID            string
	AggregateType string
	AggregateID   string
	Type          string
	Payload       []byte
	PayloadNull   bool
	Headers       map[string]string
	TraceContext  string
	CreatedAt     time.Time
	Attempts      int
	Partition     int // the aggregate's partition (PostgreSQL; 0 elsewhere)
	// Columns holds the columns beyond the outbox's own that the claim was asked for
	// (ClaimParams.Columns), by name. nil when none were.
	Columns map[string]Value
}

// Value is a column's value as the relay reads it: its PostgreSQL type, as
// pg_typeof names it ("integer", "timestamp without time zone", ...), and the
// value as Go holds it: nil (NULL), int64 (smallint, integer, bigint), float64
// (real, double precision), bool, string (text types, uuid, json, jsonb), []byte
// (bytea) or time.Time (timestamp, timestamptz, date; a timestamp's wall clock in
// UTC). A type outside these arrives as its text in a string.
type Value struct {
	Type string
	V    any
}

// Store is a table's store, both roles: what every driver gives.
type Store interface {
	Source
	Admin
}

// Source is the relay's side of a table: what its hot loop needs. A CDC source
// implements only this; the table store's Admin serves the operator.
type Source interface {
	// Claim locks up to params.Limit committed, unpublished rows in write order,
	// skipping rows another claim holds. The claim holds its lock until Complete
	// or Release; an empty claim is released by the store and returned with no rows.
	Claim(ctx context.Context, params *ClaimParams) (Claim, error)
	// AcquireLeadership tries once to become the single active relay for the table.
	// It returns (nil, nil) when another relay holds it.
	AcquireLeadership(ctx context.Context, params *LeadershipParams) (Leadership, error)
	// Listen subscribes to the writer's wake-up notifications, or returns
	// ErrNotSupported.
	Listen(ctx context.Context) (Listener, error)
	// Cleanup deletes up to params.Limit published rows published before
	// params.Before and returns how many. It never deletes an unpublished row.
	Cleanup(ctx context.Context, params *CleanupParams) (int64, error)
	// Capabilities declares what the source honours; what it does not, it refuses
	// with ErrNotSupported.
	Capabilities() Capabilities
}

// Capabilities declare what a Source honours, so that the relay refuses at
// construction, with one clear error, a configuration the store cannot honour
// instead of failing each event at run time. The driver suite checks each
// declaration against behaviour: what is declared works, what is not is refused.
type Capabilities struct {
	// Completions are the completion modes Complete honours.
	Completions []Completion
	// Columns: claims read a table's custom columns (ClaimParams.Columns).
	Columns bool
	// MaxSeq: claims can be bounded by write position (ClaimParams.MaxSeq).
	MaxSeq bool
	// Listen: Listen delivers the writer's wake-ups (without it, polling alone).
	Listen bool
	// Split: a claim can be completed in parts. Complete writes only the rows it
	// names (the others are left unpublished and unlocked: still in flight at the
	// broker), the claim is a Settler that writes their outcome later, and claims
	// skip the aggregates in flight (ClaimParams.Skip). The relay uses it so that a
	// slow key holds only itself.
	Split bool
	// CompletesLater: Complete returns before the published rows are completed (a
	// CDC source completes them beside the stream); CompleteParams.Completed is told
	// when they are. Without it, Complete returning nil says they are.
	CompletesLater bool
}

// Completes reports whether Complete honours completion c.
func (c Capabilities) Completes(m Completion) bool {
	for _, x := range c.Completions {
		if x == m {
			return true
		}
	}
	return false
}

// Basic is what every driver's table store honours: mark and delete completion.
func Basic() Capabilities {
	return Capabilities{Completions: []Completion{CompleteMark, CompleteDelete}}
}

// Admin is the operator's side of a table: status and dead letters.
type Admin interface {
	// Status reports the backlog.
	Status(ctx context.Context) (*Status, error)
	// ListDead returns dead letters matching the filter, oldest first.
	ListDead(ctx context.Context, f *DeadFilter) ([]DeadLetter, error)
	// ReplayDead moves matching dead letters back into the outbox with their
	// original write position (so they go out before the later events of their
	// aggregate) and zero attempts, releasing their keys. It returns how many moved.
	ReplayDead(ctx context.Context, f *DeadFilter) (int, error)
	// PurgeDead deletes matching dead letters, releasing their keys.
	PurgeDead(ctx context.Context, f *DeadFilter) (int, error)
	// EditDead changes a dead letter's payload or headers (an operator's fix before
	// a replay). ErrEventNotFound when no dead letter has that id.
	EditDead(ctx context.Context, id string, e *DeadEdit) error
	// RetryNow makes matching events that wait for a retry (refused before: attempts
	// > 0, due later) due now, their attempts kept: an operator's "retry now" once a
	// destination is fixed. A delayed event that never failed is left alone. It
	// returns how many.
	RetryNow(ctx context.Context, f *WaitFilter) (int, error)
	// Event finds one event by id wherever it is (waiting in the outbox, published
	// and kept, archived, dead) and tells its story. ErrEventNotFound when no table
	// holds it (an id that is not a UUID included).
	Event(ctx context.Context, id string) (*EventInfo, error)
}

// EventState is where an event is in its life.
type EventState string

// The states of an event.
const (
	EventWaiting   EventState = "waiting"   // in the outbox, not yet published
	EventPublished EventState = "published" // acknowledged by the broker, kept until cleanup
	EventDead      EventState = "dead"      // moved to the dead letters
)

// EventInfo is one event's story.
type EventInfo struct {
	Row
	State EventState
	// Error is the latest refusal of a waiting event, or why a dead one died.
	Error string
	// AvailableAt is when a waiting event is due (a retry's time, or a delayed
	// event's); zero when it is due since it was written.
	AvailableAt time.Time
	// PublishedAt is when the relay completed a published event (mark or archive).
	PublishedAt time.Time
	// Archived says the published event was moved to the archive table.
	Archived bool
	// DeadAt and HoldsKey describe a dead event.
	DeadAt   time.Time
	HoldsKey bool
}

// CleanupParams select published rows to delete.
type CleanupParams struct {
	Before time.Time
	Limit  int
}

// DeadFilter selects dead letters. Empty fields match everything.
type DeadFilter struct {
	IDs           []string
	AggregateType string
	AggregateID   string
	Type          string
	OlderThan     time.Duration // dead for at least this long
	Limit         int           // 0: no limit
	// PayloadMax, when positive, cuts each listed payload to at most that many bytes
	// (PostgreSQL and SQLite in the query, so a huge payload never leaves the
	// database whole; MySQL after reading), and DeadLetter.PayloadSize tells its
	// whole length: a list needs a preview, not every payload.
	PayloadMax int
}

// DeadEdit is what EditDead changes: a nil field is left as it is.
type DeadEdit struct {
	Payload []byte
	// Headers replace the dead letter's headers as a whole (an empty map clears them).
	Headers map[string]string
}

// HeadersJSON is Headers as the headers column stores them (nil: no change).
func (e *DeadEdit) HeadersJSON() ([]byte, error) {
	if e.Headers == nil {
		return nil, nil
	}
	return json.Marshal(e.Headers)
}

// WaitFilter selects waiting events. Empty fields match every one.
type WaitFilter struct {
	IDs           []string
	AggregateType string
	AggregateID   string
}

// DeadLetter is an event moved out of the outbox because it could not be published.
type DeadLetter struct {
	Row
	Error    string
	DeadAt   time.Time
	HoldsKey bool // later events of its aggregate wait until it is replayed or purged
	// PayloadSize is the whole payload's length in bytes when DeadFilter.PayloadMax
	// cut it (then len(Payload) < PayloadSize); 0 otherwise.
	PayloadSize int
}

// CutPayload cuts d's payload to max bytes (max > 0), noting its whole size: the
// drivers that cannot cut in the query.
func (d *DeadLetter) CutPayload(max int) {
	if max > 0 && len(d.Payload) > max {
		d.PayloadSize = len(d.Payload)
		d.Payload = d.Payload[:max:max]
	}
}

// LeadershipParams configure a leadership.
type LeadershipParams struct {
	// Timeout is how long the database keeps the leadership of a holder that shows
	// no sign of life (a paused process, a cut network, a half-open connection):
	// past it, the database itself ends the holder's session and the lock is free
	// for a standby. The holder proves it is alive by calling Check well within it.
	// Zero: the driver's default, which may be unbounded (see each driver).
	Timeout time.Duration
}

// AggregateKey is the one key of an aggregate (type and id, which may hold any bytes
// but NUL on PostgreSQL): the unit of ordering, holds and quarantine.
func AggregateKey(aggregateType, aggregateID string) string {
	return aggregateType + "\x00" + aggregateID
}

// MaxKeyBytes bounds an aggregate key (type and id together, in bytes) that the
// stores can index: PostgreSQL's btree refuses an entry over 2704 bytes, and the
// indexes of failing rows and of dead letters holding their aggregate hold the key.
// The writer keeps keys far below it (255 and 1024 bytes); a row written by plain
// SQL may not. An event whose key is longer can neither wait for a retry nor hold its
// aggregate: the relay moves it to the dead letters at its first failure, holding
// nothing back.
const MaxKeyBytes = 2000

// KeyTooLong reports whether an aggregate key is over MaxKeyBytes.
func KeyTooLong(aggregateType, aggregateID string) bool {
	return len(aggregateType)+len(aggregateID) > MaxKeyBytes
}

// LeaseBound is implemented by a Leadership whose bound is its own rather than
// LeadershipParams.Timeout (SQLite's lease TTL): the relay fences itself by it.
type LeaseBound interface {
	Bound() time.Duration
}

// ClaimParams configure a claim.
type ClaimParams struct {
	Limit int
	// MaxBytes, when positive, ends the claim once its rows' payloads add up to at
	// least this many bytes (the first row is always taken): the relay's memory is
	// bounded by bytes, not only by rows. Rows the query matched past it stay
	// unpublished; on PostgreSQL and MySQL they stay locked until the claim ends. The
	// CDC source honours it too.
	MaxBytes int
	// FlowPastDeadLetters says an event the store itself dead-letters (the CDC
	// source's rejects) does not hold back its aggregate's later events: the relay's
	// setting, passed down so it lives in one place.
	FlowPastDeadLetters bool
	// HoldTimeout, when positive, is how long the claim's transaction may sit idle
	// before the database ends its session and its row locks go (a paused or cut-off
	// relay cannot hold rows past its leadership).
	HoldTimeout time.Duration
	// MaxSeq, when positive, claims only rows with seq <= MaxSeq (the CDC relay's
	// backfill of the rows written before its replication slot). PostgreSQL only:
	// other drivers return ErrNotSupported when it is set.
	MaxSeq int64
	// Group, when set, claims only the partitions of its leases, and the claim's
	// write-back applies only while the relay still holds those leases (GroupStore).
	Group *ClaimGroup
	// Columns names columns of the table beyond the outbox's own (a Debezium table's
	// custom columns) to read into Row.Columns. PostgreSQL only: other drivers
	// return ErrNotSupported when it is set.
	Columns []string
	// Skip are aggregates whose events the claim must not take: the relay's
	// stragglers, still in flight at the broker after their batch was completed
	// without them, and their aggregates' later events, which must wait for them.
	// Sources without Capabilities.Split return ErrNotSupported when it is set.
	Skip []Aggregate
	// Ahead are the seqs of rows the claiming relay holds in earlier claims, sent or
	// being sent, and not yet marked: the one exception to the head rule (ClaimHeads).
	// A row whose earlier unpublished events are all here or in the claim itself is
	// taken; its batch goes out only after theirs was acknowledged and marked.
	Ahead []int64
}

// Aggregate names one aggregate, the unit of ordering.
type Aggregate struct {
	Type, ID string
}

// Enough reports whether a claim holding bytes of payload has reached MaxBytes.
func (p *ClaimParams) Enough(bytes int) bool { return p.MaxBytes > 0 && bytes >= p.MaxBytes }

// ClaimGroup is what a relay of a group claims under.
type ClaimGroup struct {
	RelayID string
	Leases  []Lease
}

// GroupStore lets several relays run at once, each owning some of the table's
// partitions through leases with epochs (PostgreSQL). The state machine is in package
// relay's documentation.
type GroupStore interface {
	Store
	// AcquireMembership tries once to join the table's group. It returns (nil, nil)
	// while a relay outside the group is active (AcquireLeadership excludes members,
	// and members exclude it).
	AcquireMembership(ctx context.Context) (Leadership, error)
	// Heartbeat records the relay as alive and returns the live relays (a heartbeat
	// younger than TTL), sorted, and the number of partitions.
	Heartbeat(ctx context.Context, p *HeartbeatParams) (*Membership, error)
	// Leases gives up the relay's leases outside Want, renews those it holds in Want,
	// takes those of Want that are free or expired (each with a new epoch), and returns
	// the leases it holds.
	Leases(ctx context.Context, p *LeaseParams) ([]Lease, error)
	// Barrier returns once no other session holds locks on unpublished rows of the
	// partitions (a previous owner's claim in flight), or fails when ctx ends first.
	Barrier(ctx context.Context, partitions []int) error
	// Leave deregisters the relay and frees its leases.
	Leave(ctx context.Context, relayID string) error
}

// HeartbeatParams identify a relay.
type HeartbeatParams struct {
	RelayID string
	Info    string // shown in `outbox status`
	TTL     time.Duration
}

// Membership is the live relays of a table.
type Membership struct {
	Relays     []string
	Partitions int
}

// LeaseParams say which partitions a relay wants.
type LeaseParams struct {
	RelayID string
	Want    []int
	TTL     time.Duration
}

// Lease is a relay's hold on a partition.
type Lease struct {
	Partition int
	Epoch     int64
}

// Claim is a set of locked rows.
type Claim interface {
	Rows() []Row
	// Complete marks (or deletes) the published rows, records failures, and
	// releases the lock, atomically. If the claim ended before (its HoldTimeout, a
	// cut connection), what the broker acknowledged is still marked where the
	// driver can fence it against newer work (PostgreSQL: see docs/architecture.md).
	Complete(ctx context.Context, params *CompleteParams) error
	// Release gives the rows back without changing them. Safe to call after Complete.
	Release(ctx context.Context) error
}

// Settler is implemented by the claims of a source with Capabilities.Split. Settle
// writes p, for rows of the claim that Complete left out, in a transaction of its
// own, restricted as Complete's fallback is (Restrict: rows still unpublished, held
// by no claim, with the attempts claimed). Its caller's claims skip those rows'
// aggregates until it returns (ClaimParams.Skip), so it needs only the claim fence
// shared.
type Settler interface {
	Settle(ctx context.Context, p *CompleteParams) error
}

// Completer is implemented by a table store that completes published rows outside
// any claim (marks, deletes or archives them, as c says). A CDC source reads rows from
// the WAL instead of claiming them, and completes them with it once the broker
// acknowledged them, so status, cleanup and a takeover by a polling relay see them
// published.
type Completer interface {
	CompletePublished(ctx context.Context, ids []string, c Completion) error
}

// ClaimKeeper is implemented by a Claim whose hold lapses when it idles for
// ClaimParams.HoldTimeout: KeepAlive proves, while the claim's batch is out, that its
// relay still runs, so a slow publish does not end the claim. It is never called
// concurrently with Complete or Release.
type ClaimKeeper interface {
	KeepAlive(ctx context.Context) error
}

// CompleteParams say what happened to a claim's rows.
type CompleteParams struct {
	// Published are the ids the broker acknowledged.
	Published []string
	// Completion is what becomes of the published rows ("" is CompleteMark).
	Completion Completion
	// Failed are rows the broker did not take.
	Failed []Failure
	// Completed, when set, is told the published ids whose rows' completion has
	// committed, by a store that completes them after Complete returned
	// (Capabilities.CompletesLater). A transactional publisher drops those ids from
	// its progress only then (relay's ledger).
	Completed func(ids []string)
}

// Completion is what becomes of a row once published.
type Completion string

const (
	// CompleteMark stamps published_at; cleanup deletes the row after the retention.
	CompleteMark Completion = "mark"
	// CompleteDelete deletes the row: no history kept, the cheapest write.
	CompleteDelete Completion = "delete"
	// CompleteArchive moves the row, in the same statement, to <table>_published, an
	// append-only table with no index but the one cleanup needs: history kept without
	// the update a mark costs (PostgreSQL; other drivers return ErrNotSupported).
	CompleteArchive Completion = "archive"
)

// ParseCompletion reads a completion name ("" is CompleteMark).
func ParseCompletion(s string) (Completion, error) {
	switch c := Completion(s); c {
	case "":
		return CompleteMark, nil
	case CompleteMark, CompleteDelete, CompleteArchive:
		return c, nil
	}
	return "", fmt.Errorf("invalid completion %q (want %q, %q or %q)", s, CompleteMark, CompleteDelete, CompleteArchive)
}

// Failure is one unpublished row and why.
type Failure struct {
	ID    string
	Error string
	// CountAttempt is false when the broker was unreachable (or the message was held
	// back behind another): such a failure does not count against the event.
	CountAttempt bool
	// RetryAt, when set, is the earliest time of the next attempt.
	RetryAt time.Time
	// Dead moves the row to the dead letters, atomically with the rest.
	Dead bool
	// HoldKey makes a dead letter hold back the later events of its aggregate.
	HoldKey bool
}

// DeadLetterRefusedRetry is how long an event waits for its next attempt when the
// dead-letter table refused it (a driver's fallback in Complete): long enough not to
// spin, short enough that a fixed table is soon noticed.
const DeadLetterRefusedRetry = time.Minute

// DeadLetterRefused is the error recorded on an event that should have moved to the
// dead letters but the dead-letter table refused: the refusal first, then why it was
// dying, bounded as every stored error is.
func DeadLetterRefused(reason string, refusal error) string {
	return boundedError("the dead-letter table refused it (" + refusal.Error() + "); it was to die for: " + reason)
}

// ErrorRefused is the error recorded on an event whose failure record was refused
// (then it is recorded again without counting an attempt): the refusal first, then the
// failure, bounded as every stored error is.
func ErrorRefused(reason string, refusal error) string {
	return boundedError("the database refused to record its failure (" + refusal.Error() + "); it failed with: " + reason)
}

func boundedError(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	for len(s) > 1000 {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// Settle writes p back after a claim's own transaction could not (it ended: the
// server's idle limit, a cut connection; or one of its statements failed). apply runs
// one transaction of its own, fenced against newer work (see Restrict). If p fails
// again as a whole, the published rows are written alone and then each failure on its
// own, so that one row the database refuses stops no other. A dead letter the
// dead-letter table refuses is recorded as a retry with the refusal as its error; a
// failure whose record is refused too (an index refusing the row's key) is recorded
// as a retry that counts no attempt and so touches no index. Either way the refusal
// stays with its row, which waits DeadLetterRefusedRetry: nothing is lost, and
// nothing loops faster than that. Settle returns the refusals it could not record at
// all.
func Settle(ctx context.Context, p *CompleteParams, apply func(context.Context, *CompleteParams) error) error {
	err := apply(ctx, p)
	if err == nil || len(p.Failed) == 0 || ctx.Err() != nil {
		return err
	}
	if len(p.Published) > 0 {
		if err := apply(ctx, &CompleteParams{Published: p.Published, Completion: p.Completion}); err != nil {
			return err
		}
	}
	var errs []error
	for _, f := range p.Failed {
		err := apply(ctx, &CompleteParams{Failed: []Failure{f}})
		if err != nil && f.Dead && ctx.Err() == nil {
			f = asRetry(f, DeadLetterRefused(f.Error, err))
			f.CountAttempt = true
			err = apply(ctx, &CompleteParams{Failed: []Failure{f}})
		} else if err != nil && ctx.Err() == nil {
			f.Error = ErrorRefused(f.Error, err)
		}
		if err != nil && f.CountAttempt && ctx.Err() == nil {
			// Even the retry's record was refused: one that counts no attempt
			// touches no index.
			f = asRetry(f, f.Error)
			f.CountAttempt = false
			err = apply(ctx, &CompleteParams{Failed: []Failure{f}})
		}
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, fmt.Errorf("event %s: %w", f.ID, err))
		}
	}
	return errors.Join(errs...)
}

// asRetry is f recorded as a retry, with reason, after its record was refused.
func asRetry(f Failure, reason string) Failure {
	f.Error = reason
	f.Dead, f.HoldKey = false, false
	if at := time.Now().Add(DeadLetterRefusedRetry); f.RetryAt.Before(at) {
		f.RetryAt = at
	}
	return f
}

// Restrict is p limited to the claimed rows a settling transaction may still write:
// those it locked (still unpublished, held by no other claim now: SKIP LOCKED) whose
// attempts are still those claimed (no one recorded on them since). current maps the
// locked rows' ids to their attempts now. A row left out is at worst published again,
// never lost.
func (p *CompleteParams) Restrict(claimed []Row, current map[string]int) *CompleteParams {
	attempts := make(map[string]int, len(claimed))
	for i := range claimed {
		attempts[claimed[i].ID] = claimed[i].Attempts
	}
	untouched := func(id string) bool {
		a, ok := current[id]
		return ok && a == attempts[id]
	}
	q := &CompleteParams{Completion: p.Completion}
	for _, id := range p.Published {
		if untouched(id) {
			q.Published = append(q.Published, id)
		}
	}
	for _, f := range p.Failed {
		if untouched(f.ID) {
			q.Failed = append(q.Failed, f)
		}
	}
	return q
}

// IDs are the ids p writes, published first.
func (p *CompleteParams) IDs() []string {
	ids := make([]string, 0, len(p.Published)+len(p.Failed))
	ids = append(ids, p.Published...)
	for _, f := range p.Failed {
		ids = append(ids, f.ID)
	}
	return ids
}

// Leadership is a held single-active-relay lock.
type Leadership interface {
	// Check returns ErrLeadershipLost when the lock is gone.
	Check(ctx context.Context) error
	// Release gives the lock up. Safe to call twice.
	Release(ctx context.Context) error
}

// Listener waits for wake-up notifications.
type Listener interface {
	// Wait blocks until a notification arrives or ctx ends.
	Wait(ctx context.Context) error
	Close(ctx context.Context) error
}

// Status is the backlog of one outbox table.
type Status struct {
	Table       string
	Unpublished int64         // rows not yet published
	OldestAge   time.Duration // age of the oldest unpublished row, 0 when none
	Published   int64         // published rows still kept (not yet cleaned up)
	// OldestPublished is when the oldest kept published event was published: how
	// far back `outbox replay` reaches (zero: nothing kept, or not known).
	OldestPublished time.Time
	Failing         int64 // unpublished rows with at least one failed attempt
	Dead            int64 // dead letters
	HeldKeys        int64 // aggregates whose events wait behind a dead letter
	// ActiveRelay describes the relay holding leadership ("" when none), and
	// ActiveSince when it took it, where the database knows (zero otherwise).
	ActiveRelay string
	ActiveSince time.Time
	// Relays are the live and recently seen relays of a group, with their partitions,
	// and PartitionBacklog the unpublished rows per partition (group mode only).
	Relays           []RelayStatus
	PartitionBacklog []int64
	// Slots are the CDC relay's replication slots for this table (PostgreSQL). A CDC
	// relay completes the rows it publishes, so Unpublished counts as in poll mode;
	// insert-delete and table-less events have no row, and the slot's lag is their
	// backlog.
	Slots []SlotStatus
}

// RelayStatus is one relay of a group.
type RelayStatus struct {
	ID, Info     string
	HeartbeatAge time.Duration
	Partitions   []int
	OldestLease  time.Duration // how long it has held its longest-held partition
}

// SlotStatus is one replication slot of the CDC relay.
type SlotStatus struct {
	Name   string
	Exists bool // false: the slot is gone (lost); see docs/cdc.md
	Active bool // a relay streams from it now
	// WALStatus is PostgreSQL's wal_status: reserved, extended, unreserved or lost.
	WALStatus string
	// RetainedBytes is the WAL the slot keeps on disk (from its restart_lsn);
	// LagBytes is the WAL written since its confirmed position.
	RetainedBytes, LagBytes int64
	// SafeBytes is how much more WAL may be written before the slot is invalidated
	// (max_slot_wal_keep_size), -1 when unlimited.
	SafeBytes  int64
	Backfilled bool // the rows written before the slot are all published
}

// Migrator creates and upgrades the schema.
type Migrator interface {
	// Migrate applies every pending migration and returns the versions applied.
	Migrate(ctx context.Context) ([]int, error)
	// SQL returns the full schema as SQL, for teams with their own migration tool.
	SQL() (string, error)
	// Schema reads which migrations the table has, against those this build knows.
	Schema(ctx context.Context) (*SchemaState, error)
}

// Sentinel errors of SchemaState.Check.
var (
	// ErrSchemaBehind: the table lacks migrations this build knows: run `outbox
	// migrate` with this version first.
	ErrSchemaBehind = errors.New("the outbox schema is older than this build")
	// ErrSchemaAhead: a newer build migrated the table: run that version.
	ErrSchemaAhead = errors.New("the outbox schema is newer than this build")
)

// SchemaState is where a table's schema stands against the migrations a build knows.
type SchemaState struct {
	// Managed: the table has its migrations table (a table made by hand, or by
	// another tool, has not: nothing can be said of its version).
	Managed bool
	// Applied are the versions recorded, ascending; Latest is the last this build
	// knows.
	Applied []int
	Latest  int
	// Pending are migrations this build knows and the table lacks; Unknown are
	// versions recorded that this build does not know (a newer build migrated it).
	Pending, Unknown []int
}

// NewSchemaState compares the versions a build knows with those recorded (nil: the
// table has no migrations table).
func NewSchemaState(known []int, applied map[int]bool) *SchemaState {
	st := &SchemaState{Managed: applied != nil}
	isKnown := map[int]bool{}
	for _, v := range known {
		isKnown[v] = true
		st.Latest = max(st.Latest, v)
		if st.Managed && !applied[v] {
			st.Pending = append(st.Pending, v)
		}
	}
	for v := range applied {
		st.Applied = append(st.Applied, v)
		if !isKnown[v] {
			st.Unknown = append(st.Unknown, v)
		}
	}
	slices.Sort(st.Applied)
	slices.Sort(st.Unknown)
	return st
}

// Version is the last version applied (0: none).
func (s *SchemaState) Version() int {
	if len(s.Applied) == 0 {
		return 0
	}
	return s.Applied[len(s.Applied)-1]
}

// Check returns ErrSchemaBehind or ErrSchemaAhead, with what to do, when the table's
// schema is not the one this build knows; nil when it is, or when the table is not
// managed by the migrations.
func (s *SchemaState) Check() error {
	switch {
	case len(s.Unknown) > 0:
		return fmt.Errorf("%w: it has migration %d, this build knows up to %d (run the newer outbox, or roll the schema back)", ErrSchemaAhead, s.Unknown[len(s.Unknown)-1], s.Latest)
	case len(s.Pending) > 0:
		return fmt.Errorf("%w: it lacks migrations %v (run `outbox migrate` with this version first)", ErrSchemaBehind, s.Pending)
	}
	return nil
}

// HeaderHeadersInvalid names the header a row gets when its headers column is not a flat JSON
// object of strings: the event still flows, and says why its headers are missing.
const HeaderHeadersInvalid = "outbox-headers-error"

// ParseHeaders decodes a headers column (a JSON object of strings). nil means none.
func ParseHeaders(b []byte) map[string]string {
	if b == nil || string(b) == "{}" { // most rows: no headers, no decoding
		return nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return map[string]string{HeaderHeadersInvalid: err.Error()}
	}
	return h
}
