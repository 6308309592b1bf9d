package pgcdc

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// Errors callers branch on.
var (
	// ErrSlotLost means the replication slot is gone or PostgreSQL invalidated it
	// (wal_status = lost): WAL the relay had not confirmed may have been removed.
	// docs/cdc.md has the recovery; Config.RecreateSlot performs it.
	ErrSlotLost = errors.New("replication slot lost")
	// ErrForeignPublication: the publication named for this table publishes another
	// table; the relay refuses to start rather than read another table's WAL.
	ErrForeignPublication = fmt.Errorf("publication of another table: %w", outboxdriver.ErrNeedsOperator)
	// ErrWALLevel means the server's wal_level is not logical.
	ErrWALLevel = errors.New("wal_level must be logical for the CDC relay (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)")
)

// Defaults for Config.
const (
	MaxPendingDefault      = 10_000
	MaxPendingBytesDefault = 64 << 20
	StatusIntervalDefault  = time.Second
	ClaimLingerDefault     = time.Millisecond
)

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// DefaultSlot is the slot (and publication) name of a table when none is given:
// outbox_<schema>_<table> when that names the table unambiguously (a lowercase schema
// without '_', lowercase table, at most 63 bytes: public.outbox gives
// outbox_public_outbox), else that name cut short plus a hash of the exact
// schema-qualified name, so a.b_c and a_b.c (or Outbox and outbox) never share a slot.
func DefaultSlot(t outboxdriver.Table) string {
	t = t.WithDefaults()
	plain := "outbox_" + t.Schema + "_" + t.Name
	if !strings.Contains(t.Schema, "_") && plain == strings.ToLower(plain) && len(plain) <= outboxdriver.MaxIdentifierBytes {
		return plain
	}
	h := fnv.New32a()
	h.Write([]byte(t.Schema + "." + t.Name))
	base := strings.ToLower(plain)
	return fmt.Sprintf("%s_%08x", base[:min(len(base), outboxdriver.MaxIdentifierBytes-9)], h.Sum32())
}

// Config configures a Source.
type Config struct {
	// Slot is the replication slot ("" means outbox_<schema>_<table>, lowercased).
	// It is created on first start; one relay streams from it at a time.
	Slot string
	// Publication is the publication of the table's inserts ("" means the slot name).
	// It is created when missing.
	Publication string
	// MaxPending bounds the events read from the WAL and not yet acknowledged (memory
	// stays bounded whatever the size of a transaction). Default MaxPendingDefault.
	MaxPending int
	// MaxPendingBytes bounds those events' payload bytes as well (10,000 events of a
	// megabyte each would be 10 GB), once more than 100 are pending (a few huge events
	// waiting for a retry must not stop the stream for every other aggregate).
	// Default MaxPendingBytesDefault; negative: no bound.
	MaxPendingBytes int
	// StatusInterval is how often the confirmed position is reported to PostgreSQL.
	StatusInterval time.Duration
	// ClaimLinger is how long a claim that found only a few events waits for more
	// before handing them out. Default ClaimLingerDefault; negative: no wait.
	ClaimLinger time.Duration
	// RecreateSlot replaces a lost slot: a new one is created and every row still
	// unpublished in the table is published again (the documented recovery).
	RecreateSlot bool
	// Logger receives the source's logs. Default: slog.Default().
	Logger *slog.Logger
}

// Source is the relay's store in CDC mode: it reads the outbox events from the WAL
// (inserts into the table, and the table-less mode's logical messages) instead of
// polling the table. Everything else (dead letters, status, cleanup) is the table
// store's. Build it with New and hand it to relay.New like any store.
type Source struct {
	pool      *pgxpool.Pool
	inner     outboxdriver.Store
	completer outboxdriver.Completer // inner's, when it has one: rows are completed once published
	table     outboxdriver.Table
	cfg       Config
	log       *slog.Logger

	qTable, qDead, qCDC string
	deadLetterStmt      string // set by checkServer, before any session
	heldStmt            string // likewise
	bytesPayload        bool

	shared  *Shared       // the stream of many tables this one is read from (nil: its own)
	doneLSN atomic.Uint64 // shared: every event committed at or before this is done

	mu   sync.Mutex
	sess *session

	skipped atomic.Int64

	// seen is the latest snapshot waitVisible read, and when: a transaction that had
	// ended in it has ended for good, so another wait for it asks the server nothing.
	seenMu sync.Mutex
	seen   snapshot
	seenAt time.Time
}

// ForDriver returns the CDC source of an outboxpgx driver's table, on its pool and
// store. CDC builds on the driver; the driver knows nothing of it.
func ForDriver(d *outboxpgx.Driver, cfg *Config) (*Source, error) {
	if err := d.Err(); err != nil {
		return nil, err
	}
	store, err := d.Store()
	if err != nil {
		return nil, err
	}
	return New(d.Sessions(), store, d.Table(), cfg)
}

// New returns a CDC source for the table of inner (the PostgreSQL store of the same
// table, on pool).
func New(pool *pgxpool.Pool, inner outboxdriver.Store, table outboxdriver.Table, cfg *Config) (*Source, error) {
	if pool == nil || inner == nil {
		return nil, outboxdriver.ErrNoPool
	}
	table = table.WithDefaults()
	if err := table.Validate(); err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Slot == "" {
		c.Slot = DefaultSlot(table)
	}
	if c.Publication == "" {
		c.Publication = c.Slot
	}
	if !slotNameRE.MatchString(c.Slot) || !slotNameRE.MatchString(c.Publication) {
		return nil, fmt.Errorf("%w: slot and publication names must match %s (got %q, %q)",
			outboxdriver.ErrInvalidIdentifier, slotNameRE, c.Slot, c.Publication)
	}
	if c.MaxPending == 0 {
		c.MaxPending = MaxPendingDefault
	}
	if c.MaxPendingBytes == 0 {
		c.MaxPendingBytes = MaxPendingBytesDefault
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = StatusIntervalDefault
	}
	if c.ClaimLinger == 0 {
		c.ClaimLinger = ClaimLingerDefault
	}
	if c.MaxPending < 1 || c.StatusInterval < 0 {
		return nil, errors.New("pgcdc: MaxPending must be positive and StatusInterval not negative")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s := &Source{pool: pool, inner: inner, table: table, cfg: c, log: c.Logger,
		qTable: pgx.Identifier{table.Schema, table.Name}.Sanitize(),
		// The dead letters and the CDC bookkeeping are the migrations' tables
		// (002 and 003 of the PostgreSQL driver).
		qDead: pgx.Identifier{table.Schema, table.Derived("_dead")}.Sanitize(),
		qCDC:  pgx.Identifier{table.Schema, table.Derived("_cdc")}.Sanitize(),
	}
	s.completer, _ = inner.(outboxdriver.Completer)
	return s, nil
}

var _ outboxdriver.Source = (*Source)(nil)

// Slot returns the replication slot's name.
func (s *Source) Slot() string { return s.cfg.Slot }

// Publication returns the publication's name.
func (s *Source) Publication() string { return s.cfg.Publication }

// Skipped is how many WAL messages with the outbox prefix could not be decoded into an
// event (each is logged with its position).
func (s *Source) Skipped() int64 { return s.skipped.Load() }

func interpret(err error) error { return outboxpgx.InterpretError(err) }
