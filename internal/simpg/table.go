package simpg

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// table is one outbox table and the tables that belong to it: the dead letters, the
// archive of published rows, the leases of its partitions and its relays.
type table struct {
	def     outboxdriver.Table
	seq     int64 // the identity's sequence: drawn at insert, never given back
	outbox  []*row
	dead    []*row
	archive []*row
	leases  []*row // one per partition, by partition
	relays  map[string]*relay
	columns []column // columns added beyond the outbox's own

	lmu       sync.Mutex
	listeners map[*listener]struct{}
}

type relay struct {
	info      string
	heartbeat time.Time
}

// column is a custom column: its type as pg_typeof names it, and its default's text.
type column struct {
	name, typ string
	def       *string
}

// row is one tuple with its versions: the committed one everyone sees (nil: not
// there, inserted by a transaction still open, or deleted), and the one its writer
// sees until it commits.
type row struct {
	committed, pending *rec
	writer             *Tx
	locks              map[*Tx]LockMode
}

// view is the version tx sees (nil tx: a statement outside any transaction).
func (r *row) view(tx *Tx) *rec {
	if tx != nil && r.writer == tx {
		return r.pending
	}
	return r.committed
}

// rec is a version of a row of any of the table's tables.
type rec struct {
	seq                       int64
	id, aggType, aggID, typ   string
	payload                   []byte
	payloadNull               bool
	headers                   []byte // JSON object, nil for NULL
	trace                     string
	createdAt, availableAt    time.Time
	publishedAt               time.Time // zero: not published
	attempts                  int
	lastError                 string
	partition                 int
	cols                      map[string]*string
	deadAt                    time.Time // dead letters
	deadError                 string
	holdsKey                  bool
	owner                     string // leases: "" is NULL
	epoch                     int64
	leaseUntil, leaseAcquired time.Time // zero lease_until: -infinity
}

func (v *rec) clone() *rec {
	c := *v
	c.cols = maps.Clone(v.cols)
	return &c
}

func (v *rec) published() bool { return !v.publishedAt.IsZero() }

func (v *rec) aggregate() outboxdriver.Aggregate {
	return outboxdriver.Aggregate{Type: v.aggType, ID: v.aggID}
}

// outboxRow is v as a claim reads it, with the custom columns cols.
func (t *table) outboxRow(v *rec, cols []string) outboxdriver.Row {
	r := outboxdriver.Row{Seq: v.seq, ID: v.id, AggregateType: v.aggType, AggregateID: v.aggID, Type: v.typ,
		Payload: slices.Clone(v.payload), PayloadNull: v.payloadNull, TraceContext: v.trace, CreatedAt: v.createdAt,
		Attempts: v.attempts, Partition: v.partition}
	if r.Payload == nil && !v.payloadNull {
		r.Payload = []byte{}
	}
	if v.headers != nil {
		r.Headers = outboxdriver.ParseHeaders(v.headers)
	}
	if len(cols) > 0 {
		r.Columns = make(map[string]outboxdriver.Value, len(cols))
		for _, name := range cols {
			c := t.column(name)
			r.Columns[name] = outboxdriver.ParseValue(c.typ, v.cols[name])
		}
	}
	return r
}

func (t *table) column(name string) *column {
	for i := range t.columns {
		if t.columns[i].name == name {
			return &t.columns[i]
		}
	}
	return nil
}

// vacuum drops the tuples no one sees any more.
func vacuum(rows []*row) []*row {
	return slices.DeleteFunc(rows, func(r *row) bool { return r.committed == nil && r.writer == nil && len(r.locks) == 0 })
}

// insertSorted adds r to rows in seq order (a replayed dead letter keeps its seq).
func insertSorted(rows []*row, r *row, seq int64) []*row {
	i, _ := slices.BinarySearchFunc(rows, seq, func(x *row, seq int64) int {
		v := x.pending
		if v == nil {
			v = x.committed
		}
		if v == nil || v.seq < seq {
			return -1
		}
		if v.seq > seq {
			return 1
		}
		return 0
	})
	return slices.Insert(rows, i, r)
}

// AddColumn adds a column to table t (schema.name) as ALTER TABLE … ADD COLUMN does:
// typeAndDefault is its SQL type, then optionally DEFAULT and a literal ('text' or a
// number). The rows there and to come take the default.
func (db *DB) AddColumn(t outboxdriver.Table, name, typeAndDefault string) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	tb := db.tables[t.WithDefaults().String()]
	if tb == nil {
		return fmt.Errorf("%w: %s", outboxdriver.ErrTableMissing, t)
	}
	typ, def, hasDef := strings.Cut(typeAndDefault, " DEFAULT ")
	c := column{name: name, typ: strings.TrimSpace(typ)}
	if c.typ == "int" {
		c.typ = "integer"
	}
	if hasDef {
		v := strings.Trim(strings.TrimSpace(def), "'")
		c.def = &v
	}
	tb.columns = append(tb.columns, c)
	for _, r := range tb.outbox {
		for _, v := range []*rec{r.committed, r.pending} {
			if v != nil {
				if v.cols == nil {
					v.cols = map[string]*string{}
				}
				v.cols[name] = c.def
			}
		}
	}
	return nil
}

// listener waits for the table's notifications.
type listener struct {
	t    *table
	bell chan struct{}
}

func (t *table) notifyAll() {
	t.lmu.Lock()
	defer t.lmu.Unlock()
	for l := range t.listeners {
		select {
		case l.bell <- struct{}{}:
		default:
		}
	}
}
