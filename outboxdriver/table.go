package outboxdriver

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
)

// Defaults for the outbox table.
const (
	DefaultSchema     = "public"
	DefaultTable      = "outbox"
	PartitionsDefault = 64
	PartitionsMax     = 4096
)

// ErrInvalidIdentifier is returned for a table or schema name that is not a plain
// SQL identifier.
var ErrInvalidIdentifier = errors.New("invalid identifier")

// identifierRE is deliberately strict: names from configuration are validated here and
// quoted again by each driver, so nothing a user types is ever pasted into SQL.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// PayloadType is the storage type of the payload column, chosen at migration.
type PayloadType string

// Payload column types.
const (
	PayloadJSON  PayloadType = "json"  // jsonb on PostgreSQL: payloads must be valid JSON
	PayloadBytes PayloadType = "bytes" // bytea: any bytes
)

// RefusedTable is a table a relay or migrator will not act on, and why.
type RefusedTable struct {
	Table  Table
	Reason string
}

// Table names an outbox table.
type Table struct {
	Schema  string      // "" means DefaultSchema (PostgreSQL) or the connection's database
	Name    string      // "" means DefaultTable
	Payload PayloadType // "" means PayloadJSON
	// Partitioned, chosen at migration, makes the table time-partitioned by day on
	// created_at (PostgreSQL): cleanup then drops whole published days instead of
	// deleting rows. Event ids are not enforced unique across days.
	Partitioned bool
	// Partitions is how many partitions the rows are hashed into by aggregate
	// (PostgreSQL), fixed at migration. 0 means PartitionsDefault.
	Partitions int
	// Write is how the writer stores events ("" means WriteRows). The other modes
	// are for the PostgreSQL CDC relay, which reads events from the WAL.
	Write WriteMode
	// MessagePrefix is the logical message prefix of WriteMessage ("" means the
	// table's qualified name, "public.outbox").
	MessagePrefix string
}

// WriteMode is how the writer stores an event.
type WriteMode string

// Write modes.
const (
	// WriteRows inserts a row per event, kept until it is published and cleaned up.
	WriteRows WriteMode = "rows"
	// WriteInsertDelete inserts the row and deletes it in the same transaction: the
	// table stays empty and the CDC relay publishes the insert it reads from the WAL.
	// PostgreSQL only, with `outbox relay --mode cdc`.
	WriteInsertDelete WriteMode = "insert-delete"
	// WriteMessage stores no row at all: each event is a transactional logical
	// decoding message, pg_logical_emit_message(true, prefix, content), read by the
	// CDC relay (the table-less mode). PostgreSQL only, with `outbox relay --mode cdc`.
	WriteMessage WriteMode = "message"
)

// ParseTable parses "name" or "schema.name".
func ParseTable(s string) (Table, error) {
	var t Table
	if schema, name, ok := strings.Cut(s, "."); ok {
		t.Schema, t.Name = schema, name
	} else {
		t.Name = s
	}
	t = t.WithDefaults()
	return t, t.Validate()
}

// WithDefaults fills empty fields.
func (t Table) WithDefaults() Table {
	if t.Schema == "" {
		t.Schema = DefaultSchema
	}
	if t.Name == "" {
		t.Name = DefaultTable
	}
	if t.Payload == "" {
		t.Payload = PayloadJSON
	}
	if t.Write == "" {
		t.Write = WriteRows
	}
	if t.Partitions == 0 {
		t.Partitions = PartitionsDefault
	}
	if t.MessagePrefix == "" {
		t.MessagePrefix = t.Schema + "." + t.Name
	}
	return t
}

// Validate checks the names and the payload type.
func (t Table) Validate() error {
	for _, id := range []struct{ what, v string }{{"schema", t.Schema}, {"table", t.Name}} {
		if !identifierRE.MatchString(id.v) {
			return fmt.Errorf("%w: %s name %q must match %s", ErrInvalidIdentifier, id.what, id.v, identifierRE)
		}
	}
	switch t.Payload {
	case PayloadJSON, PayloadBytes:
	default:
		return fmt.Errorf("invalid payload type %q (want %q or %q)", t.Payload, PayloadJSON, PayloadBytes)
	}
	if t.Partitions < 1 || t.Partitions > PartitionsMax {
		return fmt.Errorf("invalid number of partitions %d (want 1..%d)", t.Partitions, PartitionsMax)
	}
	switch t.Write {
	case WriteRows, WriteInsertDelete, WriteMessage:
	default:
		return fmt.Errorf("invalid write mode %q (want %q, %q or %q)", t.Write, WriteRows, WriteInsertDelete, WriteMessage)
	}
	return nil
}

// ValidatePortable is Validate for a driver other than PostgreSQL's: it also refuses
// what only PostgreSQL does (partitioned tables, the table-less write modes).
func (t Table) ValidatePortable() error {
	switch {
	case t.Partitioned:
		return errors.New("partitioned outbox tables are PostgreSQL only")
	case t.Write != WriteRows:
		return fmt.Errorf("write mode %q is PostgreSQL only", t.Write)
	}
	return t.Validate()
}

// String returns schema.name, unquoted.
func (t Table) String() string { return t.Schema + "." + t.Name }

// MaxIdentifierBytes is PostgreSQL's identifier limit (NAMEDATALEN-1); MySQL's 64
// is one more. Longer names are silently cut by PostgreSQL, so two derived names
// could collide.
const MaxIdentifierBytes = 63

// Derived is the name of an object that belongs to the table (its dead-letter table,
// an index, a partition): Name+suffix when that fits MaxIdentifierBytes, else the
// name cut short plus a hash of the whole name, so derived names stay unique and the
// database never truncates one into another.
func (t Table) Derived(suffix string) string { return DerivedName(t.Name, suffix) }

// DerivedName is Table.Derived for any base name.
func DerivedName(base, suffix string) string {
	if len(base)+len(suffix) <= MaxIdentifierBytes {
		return base + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(base))
	keep := max(MaxIdentifierBytes-len(suffix)-9, 0)
	return fmt.Sprintf("%s_%08x%s", base[:min(keep, len(base))], h.Sum32(), suffix)
}

// PartitionOf is the partition of an aggregate, as the database computes it (the
// first 32 bits of md5(aggregatetype, U+001F, aggregateid), modulo partitions).
func PartitionOf(aggregateType, aggregateID string, partitions int) int {
	sum := md5.Sum([]byte(aggregateType + "\x1f" + aggregateID))
	return int(binary.BigEndian.Uint32(sum[:4]) % uint32(partitions))
}
