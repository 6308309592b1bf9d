package pgcdc

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/pgmessage"
)

// ErrMalformed wraps every decoding error: the stream is not valid pgoutput.
var ErrMalformed = errors.New("pgcdc: malformed pgoutput message")

// ChangeKind says what a decoded message means to the relay.
type ChangeKind uint8

// Change kinds. Everything pgoutput sends that is not an outbox event (updates,
// deletes, truncates, other relations, other prefixes, origins, types) is ChangeNone.
const (
	ChangeNone   ChangeKind = iota
	ChangeBegin             // a transaction starts; CommitLSN is where it will commit
	ChangeEvent             // an outbox event: Row (or Bad)
	ChangeCommit            // the transaction ends; EndLSN may be confirmed once its events are acknowledged
)

// Change is one decoded pgoutput message.
type Change struct {
	Kind      ChangeKind
	Row       outboxdriver.Row
	CommitLSN uint64 // ChangeBegin, ChangeCommit, a transactional ChangeEvent: the commit record's position
	EndLSN    uint64 // ChangeCommit: the end of the commit record, the position to confirm
	// Xid, for ChangeBegin and ChangeEvent, is the transaction's id (0 for a message
	// written outside a transaction).
	Xid uint32
	// Reject, for ChangeEvent, is why the event must not be published as it is (a
	// message written outside a transaction): it goes to the dead letters.
	Reject error
	// AvailableAt, for ChangeEvent, is when a delayed event may go out (zero: now).
	AvailableAt time.Time
	// Bad, for ChangeEvent, is why the message could not be made into an event at all
	// (its content is not an outbox event): it is skipped and reported.
	Bad error
	// Inserted, for ChangeEvent, says the event is a row inserted into the table (not
	// a table-less message): once published, the row is completed there too.
	Inserted bool
	// Schema and Table, for an inserted ChangeEvent, name the table it was inserted
	// into; Prefix, for a table-less one, is its message's prefix. A shared stream
	// (NewSharedDecoder) routes events by them.
	Schema, Table, Prefix string
}

// Column type OIDs the decoder reads in binary format.
const (
	oidBytea       = 17
	oidInt8        = 20
	oidInt4        = 23
	oidText        = 25
	oidJSON        = 114
	oidVarchar     = 1043
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

// Decoder turns pgoutput (protocol version 1, binary tuples, messages on) into outbox
// events. It is pure: no I/O, no clock, so it is fuzzed directly. One Decoder follows
// one replication stream; it is not safe for concurrent use.
type Decoder struct {
	schema, table, prefix string
	accept                func(prefix string) bool // shared: whose messages are events
	rels                  map[uint32]*relation
	inTx                  bool
	commitLSN             uint64
	commitTime            time.Time
	xid                   uint32
}

// relation is the column layout of a table as the stream last described it.
type relation struct {
	outbox       bool // the outbox table (shared: every table of the publication)
	schema, name string
	cols         []column
}

type column struct {
	field  int    // one of the field* constants, or fieldNone
	custom string // the column's name when it is a custom one (see outboxColumns)
	oid    uint32
}

const (
	fieldNone = iota
	fieldID
	fieldAggregateType
	fieldAggregateID
	fieldType
	fieldPayload
	fieldHeaders
	fieldTrace
	fieldSeq
	fieldCreatedAt
	fieldAvailableAt
)

var fieldByName = map[string]int{
	"id": fieldID, "aggregatetype": fieldAggregateType, "aggregateid": fieldAggregateID, "type": fieldType,
	"payload": fieldPayload, "headers": fieldHeaders, "tracingspancontext": fieldTrace, "seq": fieldSeq,
	"created_at": fieldCreatedAt, "available_at": fieldAvailableAt,
}

// NewDecoder returns a decoder for the inserts into table and the transactional
// logical messages whose prefix is prefix ("" for none).
func NewDecoder(table outboxdriver.Table, prefix string) *Decoder {
	t := table.WithDefaults()
	return &Decoder{schema: t.Schema, table: t.Name, prefix: prefix, rels: map[uint32]*relation{}}
}

// NewSharedDecoder returns a decoder for a stream that carries several outbox tables
// (Shared): the inserts into every table of the publication, and the transactional
// logical messages whose prefix accept accepts. Each event names its table (or
// prefix) for routing.
func NewSharedDecoder(accept func(prefix string) bool) *Decoder {
	return &Decoder{accept: accept, rels: map[uint32]*relation{}}
}

// InTransaction reports whether the last change was inside a transaction (between
// its Begin and Commit): a keepalive's position may be confirmed only outside one.
func (d *Decoder) InTransaction() bool { return d.inTx }

// Decode decodes one pgoutput message (the WAL data of one XLogData).
func (d *Decoder) Decode(msg []byte) (Change, error) {
	if len(msg) == 0 {
		return Change{}, fmt.Errorf("%w: empty message", ErrMalformed)
	}
	r := reader{b: msg[1:]}
	switch msg[0] {
	case 'B':
		final, ts, xid := r.u64(), r.u64(), r.u32()
		if r.err != nil {
			return Change{}, r.fail("begin")
		}
		d.inTx, d.commitLSN, d.xid = true, final, xid
		d.commitTime = pgEpoch.Add(time.Duration(int64(ts)) * time.Microsecond)
		return Change{Kind: ChangeBegin, CommitLSN: final, Xid: xid}, nil
	case 'C':
		_, commit, end, _ := r.u8(), r.u64(), r.u64(), r.u64()
		if r.err != nil {
			return Change{}, r.fail("commit")
		}
		d.inTx, d.xid = false, 0
		return Change{Kind: ChangeCommit, CommitLSN: commit, EndLSN: end}, nil
	case 'R':
		return Change{}, d.relation(&r)
	case 'I':
		return d.insert(&r)
	case 'M':
		return d.message(&r)
	case 'O', 'Y', 'U', 'D', 'T':
		return Change{}, nil // origins, types, updates, deletes, truncates: not events
	default:
		return Change{}, fmt.Errorf("%w: unknown message type %q", ErrMalformed, msg[0])
	}
}

func (d *Decoder) relation(r *reader) error {
	id := r.u32()
	ns, name := r.str(), r.str()
	_ = r.u8() // replica identity
	n := int(r.u16())
	if r.err != nil {
		return r.fail("relation")
	}
	rel := &relation{outbox: d.accept != nil || (ns == d.schema && name == d.table), schema: ns, name: name}
	if n > len(r.b) { // each column takes more than a byte: a lying count
		return fmt.Errorf("%w: relation: %d columns in %d bytes", ErrMalformed, n, len(r.b))
	}
	rel.cols = make([]column, n)
	for i := range rel.cols {
		_ = r.u8() // flags
		cname := r.str()
		oid := r.u32()
		_ = r.u32() // type modifier
		rel.cols[i] = column{field: fieldByName[cname], oid: oid}
		if rel.cols[i].field == fieldNone && !outboxColumns[cname] {
			rel.cols[i].custom = cname
		}
	}
	if r.err != nil {
		return r.fail("relation")
	}
	d.rels[id] = rel
	return nil
}

func (d *Decoder) insert(r *reader) (Change, error) {
	id := r.u32()
	if kind := r.u8(); r.err == nil && kind != 'N' {
		return Change{}, fmt.Errorf("%w: insert: tuple kind %q", ErrMalformed, kind)
	}
	n := int(r.u16())
	if r.err != nil {
		return Change{}, r.fail("insert")
	}
	rel, ok := d.rels[id]
	if !ok {
		return Change{}, fmt.Errorf("%w: insert into relation %d before its description", ErrMalformed, id)
	}
	if !rel.outbox {
		return Change{}, nil
	}
	if n != len(rel.cols) {
		return Change{}, fmt.Errorf("%w: insert: %d columns, relation has %d", ErrMalformed, n, len(rel.cols))
	}
	ch := Change{Kind: ChangeEvent, Xid: d.xid, CommitLSN: d.commitLSN, Inserted: true, Schema: rel.schema, Table: rel.name}
	row := &ch.Row
	seen := 0
	for _, c := range rel.cols {
		kind := r.u8()
		var v []byte
		null := false
		switch kind {
		case 'n':
			null = true
		case 'u':
			null = true // unchanged TOAST never happens on an insert
		case 't', 'b':
			v = r.bytes(int(r.u32()))
		default:
			if r.err == nil {
				return Change{}, fmt.Errorf("%w: insert: column kind %q", ErrMalformed, kind)
			}
		}
		if r.err != nil {
			return Change{}, r.fail("insert")
		}
		if c.custom != "" {
			if row.Columns == nil {
				row.Columns = map[string]outboxdriver.Value{}
			}
			row.Columns[c.custom] = customValue(c.oid, kind == 'b', v, null)
			continue
		}
		if c.field == fieldNone || (null && c.field != fieldPayload) {
			continue
		}
		seen |= 1 << c.field
		if err := setField(&ch, c, kind == 'b', v, null); err != nil && ch.Bad == nil {
			ch.Bad = err
		}
	}
	const required = 1<<fieldID | 1<<fieldAggregateType | 1<<fieldAggregateID | 1<<fieldType
	if ch.Bad == nil && seen&required != required {
		ch.Bad = errors.New("insert lacks id, aggregatetype, aggregateid or type")
	}
	if row.Seq == 0 {
		row.Seq = int64(d.commitLSN) // a table without seq: commit order
	}
	if row.CreatedAt.IsZero() {
		row.CreatedAt = d.commitTime
	}
	if ch.Bad != nil {
		ch.Row = outboxdriver.Row{}
	}
	return ch, nil
}

// setField stores one column value, text or binary format, in the row.
func setField(ch *Change, c column, binaryFmt bool, v []byte, null bool) error {
	row := &ch.Row
	switch c.field {
	case fieldID:
		if binaryFmt && c.oid == oidUUID {
			u, err := uuid.FromBytes(v)
			if err != nil {
				return fmt.Errorf("id: %w", err)
			}
			row.ID = u.String()
			return nil
		}
		u, err := uuid.ParseBytes(v)
		if err != nil {
			return fmt.Errorf("id: %w", err)
		}
		row.ID = u.String()
	case fieldAggregateType:
		row.AggregateType = string(v)
	case fieldAggregateID:
		row.AggregateID = string(v)
	case fieldType:
		row.Type = string(v)
	case fieldPayload:
		if null {
			row.PayloadNull = true
			return nil
		}
		p, err := bytesValue(c.oid, binaryFmt, v)
		if err != nil {
			return fmt.Errorf("payload: %w", err)
		}
		row.Payload = p
	case fieldHeaders:
		h, err := bytesValue(c.oid, binaryFmt, v)
		if err != nil {
			return fmt.Errorf("headers: %w", err)
		}
		row.Headers = outboxdriver.ParseHeaders(h)
	case fieldTrace:
		row.TraceContext = string(v)
	case fieldSeq:
		n, err := intValue(c.oid, binaryFmt, v)
		if err != nil {
			return fmt.Errorf("seq: %w", err)
		}
		row.Seq = n
	case fieldCreatedAt:
		row.CreatedAt = timeValue(c.oid, binaryFmt, v)
	case fieldAvailableAt:
		ch.AvailableAt = timeValue(c.oid, binaryFmt, v)
	}
	return nil
}

// timeValue reads a binary timestamp; the zero time means unknown (a text value).
func timeValue(oid uint32, binaryFmt bool, v []byte) time.Time {
	if binaryFmt && (oid == oidTimestamptz || oid == oidTimestamp) && len(v) == 8 {
		return pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(v))) * time.Microsecond)
	}
	return time.Time{}
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// bytesValue returns the bytes of a jsonb, json, bytea or text value. The result
// aliases v only where v is already the value.
func bytesValue(oid uint32, binaryFmt bool, v []byte) ([]byte, error) {
	switch {
	case oid == oidJSONB && binaryFmt:
		if len(v) == 0 || v[0] != 1 {
			return nil, errors.New("unknown jsonb binary version")
		}
		return v[1:], nil
	case oid == oidBytea && !binaryFmt:
		if len(v) < 2 || v[0] != '\\' || v[1] != 'x' {
			return nil, errors.New("bytea text is not in hex format (set bytea_output = hex)")
		}
		out := make([]byte, hex.DecodedLen(len(v)-2))
		if _, err := hex.Decode(out, v[2:]); err != nil {
			return nil, err
		}
		return out, nil
	}
	return v, nil
}

func intValue(oid uint32, binaryFmt bool, v []byte) (int64, error) {
	switch {
	case !binaryFmt:
		return strconv.ParseInt(string(v), 10, 64)
	case oid == oidInt8 && len(v) == 8:
		return int64(binary.BigEndian.Uint64(v)), nil
	case oid == oidInt4 && len(v) == 4:
		return int64(int32(binary.BigEndian.Uint32(v))), nil
	}
	return 0, fmt.Errorf("unsupported integer type %d", oid)
}

func (d *Decoder) message(r *reader) (Change, error) {
	flags := r.u8()
	lsn := r.u64()
	prefix := r.str()
	content := r.bytes(int(r.u32()))
	if r.err != nil {
		return Change{}, r.fail("message")
	}
	if d.accept != nil {
		if !d.accept(prefix) {
			return Change{}, nil
		}
	} else if d.prefix == "" || prefix != d.prefix {
		return Change{}, nil
	}
	ch := Change{Kind: ChangeEvent, Prefix: prefix}
	if flags&1 != 0 {
		ch.Xid, ch.CommitLSN = d.xid, d.commitLSN
	}
	row, at, err := pgmessage.Decode(content)
	ch.AvailableAt = at
	if err != nil {
		ch.Bad = err
		return ch, nil
	}
	if row.Seq == 0 {
		row.Seq = int64(lsn) // a message written without "seq" (by hand): its WAL position
	}
	if row.CreatedAt.IsZero() {
		row.CreatedAt = d.commitTime
	}
	ch.Row = row
	if flags&1 == 0 {
		// Not transactional: PostgreSQL sends it even if the writer's transaction
		// rolled back, so publishing it could publish a phantom.
		ch.Reject = errors.New("logical message written with transactional = false: it may belong to a rolled-back transaction")
	}
	return ch, nil
}

// reader reads big-endian protocol fields, remembering the first short read.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("need %d bytes, have %d", n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// bytes returns the next n bytes; n comes from the wire as a signed length.
func (r *reader) bytes(n int) []byte {
	if int32(n) < 0 {
		n = -1
	}
	return r.take(n)
}

// str reads a NUL-terminated string.
func (r *reader) str() string {
	if r.err != nil {
		return ""
	}
	for i, c := range r.b {
		if c == 0 {
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		}
	}
	r.err = errors.New("unterminated string")
	return ""
}

func (r *reader) fail(what string) error {
	return fmt.Errorf("%w: %s: %v", ErrMalformed, what, r.err) //nolint:errorlint // malformed input, whatever the read said: one sentinel to branch on
}
