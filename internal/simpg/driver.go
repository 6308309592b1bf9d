package simpg

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// Driver is an outboxdriver.Driver[*Tx] on one process's Client of the model.
type Driver struct {
	c     *Client
	table outboxdriver.Table
	err   error
	// lockKey is the leadership lock's key; claimFence the claim fence's (as the
	// PostgreSQL store derives them).
	lockKey, claimFence int64
}

// New binds a driver to table t through c.
func New(c *Client, t *outboxdriver.Table) *Driver {
	d := &Driver{c: c}
	if t != nil {
		d.table = *t
	}
	d.table = d.table.WithDefaults()
	d.err = d.table.Validate()
	h := fnv.New64a()
	h.Write([]byte("outbox relay leadership " + d.table.String()))
	d.lockKey = int64(h.Sum64())
	d.claimFence = d.lockKey + 2
	return d
}

// Name implements outboxdriver.Driver.
func (d *Driver) Name() string { return "simpg" }

// Table implements outboxdriver.Driver.
func (d *Driver) Table() outboxdriver.Table { return d.table }

// Err implements outboxdriver.Driver.
func (d *Driver) Err() error { return d.err }

// UnwrapExecutor implements outboxdriver.Driver.
func (d *Driver) UnwrapExecutor(tx *Tx) outboxdriver.Executor { return executor{d: d, tx: tx} }

// GetExecutor implements outboxdriver.Driver: each call a transaction of its own.
func (d *Driver) GetExecutor() (outboxdriver.Executor, error) {
	if d.err != nil {
		return nil, d.err
	}
	return executor{d: d}, nil
}

// Store implements outboxdriver.Driver.
func (d *Driver) Store() (outboxdriver.Store, error) {
	if d.err != nil {
		return nil, d.err
	}
	return &Store{d: d, db: d.c.db}, nil
}

// Migrator implements outboxdriver.Driver.
func (d *Driver) Migrator() (outboxdriver.Migrator, error) {
	if d.err != nil {
		return nil, d.err
	}
	return migrator{d}, nil
}

// Begin starts a transaction (the application's, or another session's).
func (c *Client) Begin(ctx context.Context) (*Tx, error) { return c.db.begin(ctx, c) }

// Commit commits tx.
func (tx *Tx) Commit(ctx context.Context) error { return tx.commit(ctx) }

// Rollback rolls tx back; after its end, it does nothing.
func (tx *Tx) Rollback(context.Context) error {
	tx.rollback()
	return nil
}

// table is the driver's table, or ErrTableMissing (under db.mu).
func (d *Driver) tableIn(db *DB) (*table, error) {
	t := db.tables[d.table.String()]
	if t == nil {
		return nil, fmt.Errorf("%w: relation %q does not exist", outboxdriver.ErrTableMissing, d.table.String())
	}
	return t, nil
}

// autocommit runs fn in a transaction of its own, committed when fn succeeds.
func (d *Driver) autocommit(ctx context.Context, fn func(tx *Tx, t *table) error) error {
	tx, err := d.c.Begin(ctx)
	if err != nil {
		return err
	}
	d.c.db.mu.Lock()
	err = tx.stmt(ctx)
	var t *table
	if err == nil {
		t, err = d.tableIn(d.c.db)
	}
	if err == nil {
		err = fn(tx, t)
	}
	d.c.db.mu.Unlock()
	if err != nil {
		tx.rollback()
		return err
	}
	return tx.commit(ctx)
}

type executor struct {
	d  *Driver
	tx *Tx // nil: a transaction of its own
}

// run runs fn as a statement of the executor's transaction, or of one of its own.
func (e executor) run(ctx context.Context, fn func(tx *Tx, t *table) error) error {
	if e.tx == nil {
		return e.d.autocommit(ctx, fn)
	}
	db := e.d.c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if err := e.tx.stmt(ctx); err != nil {
		return err
	}
	t, err := e.d.tableIn(db)
	if err != nil {
		return err
	}
	return fn(e.tx, t)
}

// InsertEvents implements outboxdriver.Executor: a row per event (its seq drawn now,
// seen by others once the transaction commits); insert-delete inserts and deletes
// it; message draws the seq and stores nothing the model keeps (it has no WAL).
func (e executor) InsertEvents(ctx context.Context, p *outboxdriver.InsertParams) error {
	return e.run(ctx, func(tx *Tx, t *table) error { return e.d.insert(ctx, tx, t, p.Events, false) })
}

// insert adds events to t in tx; plain: only the five Debezium columns were given.
func (d *Driver) insert(_ context.Context, tx *Tx, t *table, events []outboxdriver.InsertEvent, plain bool) error {
	at := tx.start
	for _, ev := range events {
		for _, r := range t.outbox {
			for _, v := range []*rec{r.committed, r.pending} {
				if v != nil && v.id == ev.ID {
					return fmt.Errorf("%w: Key (id)=(%s) already exists", outboxdriver.ErrDuplicateID, ev.ID)
				}
			}
		}
	}
	for _, ev := range events {
		t.seq++
		if d.table.Write == outboxdriver.WriteMessage {
			continue
		}
		v := &rec{seq: t.seq, id: ev.ID, aggType: ev.AggregateType, aggID: ev.AggregateID, typ: ev.Type,
			payload: append([]byte{}, ev.Payload...), headers: ev.Headers, trace: ev.TraceContext,
			createdAt: at, availableAt: at, partition: outboxdriver.PartitionOf(ev.AggregateType, ev.AggregateID, t.def.Partitions)}
		if !ev.AvailableAt.IsZero() && !plain {
			v.availableAt = ev.AvailableAt.Truncate(time.Microsecond)
		}
		if len(t.columns) > 0 {
			v.cols = map[string]*string{}
			for _, c := range t.columns {
				v.cols[c.name] = c.def
			}
		}
		r := tx.insert(v)
		t.outbox = append(t.outbox, r)
		if d.table.Write == outboxdriver.WriteInsertDelete {
			tx.set(r, nil)
		}
	}
	return nil
}

// Notify implements outboxdriver.Executor: delivered when the transaction commits.
func (e executor) Notify(ctx context.Context) error {
	if e.d.table.Write != outboxdriver.WriteRows {
		return nil
	}
	return e.run(ctx, func(tx *Tx, t *table) error {
		tx.notify = append(tx.notify, t)
		return nil
	})
}

// InsertPlain inserts a row of the five Debezium columns, as a producer in another
// language would by plain SQL: the rest take their defaults.
func (d *Driver) InsertPlain(ctx context.Context, id, aggregateType, aggregateID, typ, payload string) error {
	return d.autocommit(ctx, func(tx *Tx, t *table) error {
		return d.insert(ctx, tx, t, []outboxdriver.InsertEvent{{ID: id, AggregateType: aggregateType, AggregateID: aggregateID,
			Type: typ, Payload: []byte(payload)}}, true)
	})
}

// migrator creates the table. The model has one schema version: the PostgreSQL
// store's latest.
type migrator struct{ d *Driver }

var modelVersions = []int{1}

func (m migrator) Migrate(ctx context.Context) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	db := m.d.c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	key := m.d.table.String()
	if db.tables[key] != nil {
		return []int{}, nil
	}
	t := &table{def: m.d.table, relays: map[string]*relay{}, listeners: map[*listener]struct{}{}}
	for p := range t.def.Partitions {
		t.leases = append(t.leases, &row{committed: &rec{partition: p}})
	}
	db.tables[key] = t
	return modelVersions, nil
}

func (m migrator) SQL() (string, error) {
	return "-- " + m.d.table.String() + ": the simulated PostgreSQL (internal/simpg) keeps its tables in memory;\n" +
		"-- its schema is the PostgreSQL store's, at its latest migration.\n", nil
}

func (m migrator) Schema(context.Context) (*outboxdriver.SchemaState, error) {
	db := m.d.c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.tables[m.d.table.String()] == nil {
		return outboxdriver.NewSchemaState(modelVersions, nil), nil
	}
	return outboxdriver.NewSchemaState(modelVersions, map[int]bool{1: true}), nil
}
