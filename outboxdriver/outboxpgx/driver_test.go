package outboxpgx_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) { conformance(t, false, false) }

// TestConformancePartitioned runs the suite on a table partitioned by day.
func TestConformancePartitioned(t *testing.T) { conformance(t, true, false) }

// TestConformanceShared runs it with the leadership locks and wake-ups of every
// driver the harness makes on one Shared (the many-table relay's sessions): two
// relays of one table in one process still exclude each other, and a wake-up still
// reaches its table.
func TestConformanceShared(t *testing.T) { conformance(t, false, true) }

func conformance(t *testing.T, partitioned, shared bool) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[pgx.Tx] {
		t.Helper()
		pool := testenv.Pool(t, url)
		table := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "outbox", Payload: payload, Partitioned: partitioned}
		open := func(t outboxdriver.Table) *outboxpgx.Driver { return outboxpgx.New(pool, &t) }
		if shared {
			sh := outboxpgx.NewShared(pool)
			t.Cleanup(sh.Close)
			open = func(t outboxdriver.Table) *outboxpgx.Driver { return outboxpgx.New(pool, &t).WithShared(sh) }
		}
		return &outboxdrivertest.Harness[pgx.Tx]{
			Driver:   open(table),
			Begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
			Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			AddColumn: func(ctx context.Context, name, typ string) error {
				_, err := pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+" ADD COLUMN "+name+" "+typ)
				return err
			},
			InsertPlain: func(ctx context.Context, id, at, aid, typ, payload string) error {
				_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+
					" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)", id, at, aid, typ, payload)
				return err
			},
			Reopen:            func(t outboxdriver.Table) outboxdriver.Driver[pgx.Tx] { return open(t) },
			HoldRow:           testenv.HoldRow(testenv.SQL(t, url), pgx.Identifier{table.Schema, table.Name}.Sanitize(), "FOR SHARE", "$1::uuid"),
			MultipleClaims:    true,
			ConcurrentWriters: true,
			NonUniqueIDs:      partitioned,
		}
	})
}

// partitionedEvents migrates a table "events" partitioned by day in a schema of the
// test's own.
func partitionedEvents(t *testing.T) (*pgxpool.Pool, outboxdriver.Table, *outboxpgx.Driver, outboxdriver.Migrator) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "events", Partitioned: true}
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool, table, drv, m
}

// TestPartitionRotation: cleanup creates the coming days' partitions and drops a past
// day only once every row of it is published.
func TestPartitionRotation(t *testing.T) {
	t.Parallel()
	pool, table, drv, _ := partitionedEvents(t)
	ctx := context.Background()
	partitions := func() map[string]bool {
		rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass`,
			pgx.Identifier{table.Schema, table.Name}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]bool{}
		for rows.Next() {
			var n string
			_ = rows.Scan(&n)
			out[n] = true
		}
		return out
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	for i := 0; i <= 3; i++ {
		if name := "events_p" + today.AddDate(0, 0, i).Format("20060102"); !partitions()[name] {
			t.Fatalf("migration did not create %s: %v", name, partitions())
		}
	}
	// A day ten days ago with three rows: two published long ago, one not.
	old := today.AddDate(0, 0, -10)
	oldName := "events_p" + old.Format("20060102")
	qt := pgx.Identifier{table.Schema, table.Name}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table.Schema, oldName}.Sanitize()+" PARTITION OF "+qt+
		" FOR VALUES FROM ('"+old.Format(time.RFC3339)+"') TO ('"+old.AddDate(0, 0, 1).Format(time.RFC3339)+"')"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+qt+` (id, aggregatetype, aggregateid, type, payload, created_at, published_at) VALUES
		(gen_random_uuid(), 'order', '1', 'T', '{}', $1, $1), (gen_random_uuid(), 'order', '1', 'T', '{}', $1, $1),
		(gen_random_uuid(), 'order', '2', 'T', '{}', $1, NULL)`, old.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	store, _ := drv.Store()
	n, err := store.Cleanup(ctx, &outboxdriver.CleanupParams{Before: today.AddDate(0, 0, -7), Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || !partitions()[oldName] {
		t.Fatalf("cleanup deleted %d rows and the old day is there=%v; want the 2 published rows deleted and the day kept for its unpublished row", n, partitions()[oldName])
	}
	if _, err := pool.Exec(ctx, "UPDATE "+qt+" SET published_at = $1 WHERE published_at IS NULL", old.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n, err = store.Cleanup(ctx, &outboxdriver.CleanupParams{Before: today.AddDate(0, 0, -7), Limit: 1000}); err != nil || n != 1 {
		t.Fatalf("second cleanup: %d, %v; want the day dropped with its 1 row", n, err)
	}
	if partitions()[oldName] {
		t.Fatal("a fully published old day was not dropped")
	}
}

// TestArchivePartitionRotation: on a table partitioned by day the archive of published
// rows is partitioned by day of publication: archived rows land in today's partition,
// cleanup drops past days whole, and an archive made before it was partitioned (an
// older migration) becomes the default partition with its rows.
func TestArchivePartitionRotation(t *testing.T) {
	t.Parallel()
	pool, table, drv, m := partitionedEvents(t)
	ctx := context.Background()
	qa := pgx.Identifier{table.Schema, "events_published"}.Sanitize()
	days := func() map[string]int {
		rows, err := pool.Query(ctx, `SELECT c.relname, (xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %I.%I', $2::text, c.relname), false, true, '')))[1]::text::int
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass`, qa, table.Schema)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var n string
			var c int
			if err := rows.Scan(&n, &c); err != nil {
				t.Fatal(err)
			}
			out[n] = c
		}
		return out
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	todayName := "events_published_p" + today.Format("20060102")
	for i := 0; i <= 3; i++ {
		if name := "events_published_p" + today.AddDate(0, 0, i).Format("20060102"); !hasKey(days(), name) {
			t.Fatalf("migration did not create %s: %v", name, days())
		}
	}
	// Archived rows land in today's partition.
	w, _ := outbox.NewWriter(drv, nil)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return w.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`)},
			outbox.Event{AggregateType: "order", AggregateID: "2", Type: "T", Payload: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	store, _ := drv.Store()
	c, err := store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range c.Rows() {
		ids = append(ids, r.ID)
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: ids, Completion: outboxdriver.CompleteArchive}); err != nil {
		t.Fatal(err)
	}
	if got := days()[todayName]; got != 2 {
		t.Fatalf("today's archive partition holds %d rows, want the 2 archived: %v", got, days())
	}
	// A day of the archive ten days ago is dropped whole by cleanup; today's stays.
	old := today.AddDate(0, 0, -10)
	oldName := "events_published_p" + old.Format("20060102")
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table.Schema, oldName}.Sanitize()+" PARTITION OF "+qa+
		" FOR VALUES FROM ('"+old.Format(time.RFC3339)+"') TO ('"+old.AddDate(0, 0, 1).Format(time.RFC3339)+"')"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+qa+` (id, seq, aggregatetype, aggregateid, type, payload, created_at, published_at)
		SELECT gen_random_uuid(), g, 'order', '1', 'T', '{}', $1, $1 FROM generate_series(1, 3) AS g`, old.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	n, err := store.Cleanup(ctx, &outboxdriver.CleanupParams{Before: today.AddDate(0, 0, -7), Limit: 1000})
	if err != nil || n != 3 {
		t.Fatalf("cleanup: %d, %v; want the old archive day dropped with its 3 rows", n, err)
	}
	if d := days(); hasKey(d, oldName) || d[todayName] != 2 {
		t.Fatalf("after cleanup: %v; want the old day gone and today's 2 rows kept", d)
	}
	st, err := store.Status(ctx)
	if err != nil || st.Published != 2 {
		t.Fatalf("status: %+v, %v; want the 2 archived rows counted as published", st, err)
	}

	// An archive made before this migration (a plain table, with rows) is adopted as
	// the default partition.
	if _, err := pool.Exec(ctx, "DROP TABLE "+qa+"; CREATE TABLE "+qa+" (LIKE "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+
		" INCLUDING DEFAULTS); INSERT INTO "+qa+` (id, seq, aggregatetype, aggregateid, type, payload, created_at, published_at)
		VALUES (gen_random_uuid(), 1, 'order', '1', 'T', '{}', now() - interval '2 days', now() - interval '2 days');
		DELETE FROM `+pgx.Identifier{table.Schema, "events_migrations"}.Sanitize()+" WHERE version = 7"); err != nil {
		t.Fatal(err)
	}
	if applied, err := m.Migrate(ctx); err != nil || len(applied) != 1 {
		t.Fatalf("migrate an older archive: %v, %v", applied, err)
	}
	if d := days(); d["events_published_default"] != 1 || !hasKey(d, todayName) {
		t.Fatalf("after adopting the older archive: %v; want its row in the default partition and today's partition made", d)
	}
}

func hasKey(m map[string]int, k string) bool { _, ok := m[k]; return ok }

// TestAdoptDebeziumTable: migrating an existing Debezium outbox table (its five
// columns, rows already in it) adds what the relay needs and keeps the rows.
func TestAdoptDebeziumTable(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	schema := testenv.Schema(t, url)
	ctx := context.Background()
	qt := pgx.Identifier{schema, "OutboxEvent"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+qt+` (id uuid NOT NULL PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb);
		INSERT INTO `+qt+` VALUES ('4d47e190-0402-4048-bc2c-89dd54343cdc', 'Order', '1', 'OrderCreated', '{"id": 1}'),
		                          ('5d47e190-0402-4048-bc2c-89dd54343cdc', 'Order', '1', 'OrderShipped', '{"id": 1}')`); err != nil {
		t.Fatal(err)
	}
	drv := outboxpgx.New(pool, &outboxdriver.Table{Schema: schema, Name: "OutboxEvent"})
	m, _ := drv.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatalf("migrate an existing Debezium table: %v", err)
	}
	store, _ := drv.Store()
	c, err := store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx)
	rows := c.Rows()
	if len(rows) != 2 || rows[0].Type != "OrderCreated" || rows[1].Type != "OrderShipped" || rows[0].Seq >= rows[1].Seq {
		t.Fatalf("rows after adoption: %+v", rows)
	}
}

// TestPartitionComputedByDatabase: a row inserted by plain SQL with only the five
// Debezium columns gets its partition from the database, the same one Go computes, and
// the rows spread over the partitions.
func TestPartitionComputedByDatabase(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	schema := testenv.Schema(t, url)
	ctx := context.Background()
	for _, p := range []int{0, 8} {
		table := outboxdriver.Table{Schema: schema, Name: fmt.Sprintf("outbox_p%d", p), Partitions: p}
		m, _ := outboxpgx.New(pool, &table).Migrator()
		if _, err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		want := table.WithDefaults().Partitions
		qt := pgx.Identifier{schema, table.Name}.Sanitize()
		if _, err := pool.Exec(ctx, `INSERT INTO `+qt+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', 'agg-' || i || 'é', 'T', '{}' FROM generate_series(1, 2000) AS i`); err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(ctx, `SELECT aggregatetype, aggregateid, partition FROM `+qt)
		if err != nil {
			t.Fatal(err)
		}
		counts := make([]int, want)
		for rows.Next() {
			var at, aid string
			var part int
			if err := rows.Scan(&at, &aid, &part); err != nil {
				t.Fatal(err)
			}
			if got := outboxdriver.PartitionOf(at, aid, want); got != part {
				t.Fatalf("%s/%s: database partition %d, Go %d", at, aid, part, got)
			}
			counts[part]++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for i, n := range counts {
			if n < 2000/want/3 {
				t.Fatalf("%d partitions: partition %d holds %d of 2000 rows: %v", want, i, n, counts)
			}
		}
	}
}

// TestLongTableNames: valid names up to 63 bytes migrate (plain and partitioned), keep
// every derived index and table distinct, and take writes with notifications on (the
// NOTIFY channel fits PostgreSQL's limit): PostgreSQL would otherwise truncate derived
// names into each other and refuse the channel, failing the caller's transaction.
func TestLongTableNames(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	schema := testenv.Schema(t, url)
	for _, n := range []int{50, 58, 61, 63} {
		for _, partitioned := range []bool{false, true} {
			name := fmt.Sprintf("%s%d", strings.Repeat("x", n-3), n)
			name = name[:n-1] + map[bool]string{true: "p", false: "r"}[partitioned]
			table := outboxdriver.Table{Schema: schema, Name: name, Partitioned: partitioned}
			drv := outboxpgx.New(pool, &table)
			m, _ := drv.Migrator()
			if _, err := m.Migrate(ctx); err != nil {
				t.Fatalf("%d bytes, partitioned=%v: migrate: %v", n, partitioned, err)
			}
			w, err := outbox.NewWriter(drv, nil)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.WriteTx(ctx, tx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "T", Payload: []byte("{}")}); err != nil {
				t.Fatalf("%d bytes: write: %v", n, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("%d bytes: commit: %v", n, err)
			}
			var indexes int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 AND indexname <> $2 || '_pkey'`,
				schema, name).Scan(&indexes); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 3, true: 3}[partitioned]; indexes < want {
				t.Fatalf("%d bytes, partitioned=%v: %d indexes on the table, want %d distinct ones", n, partitioned, indexes, want)
			}
		}
	}
}

// TestAdoptedPayloadTypes: a table that began as a Debezium outbox keeps its payload
// type (text, varchar, json, jsonb, bytea), and the dead letters and the archive take
// it: an event refused permanently moves to the dead letters, is replayed, and is
// archived once published, with its payload intact. (With payload text the move used
// to fail on 'column "payload" is of type jsonb', and the relay sent the batch again
// for ever.)
func TestAdoptedPayloadTypes(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	for _, typ := range []string{"text", "varchar(4000)", "json", "jsonb", "bytea"} {
		t.Run(typ, func(t *testing.T) {
			schema := testenv.Schema(t, url)
			qt := pgx.Identifier{schema, "outboxevent"}.Sanitize()
			const id = "4d47e190-0402-4048-bc2c-89dd54343cdc"
			if _, err := pool.Exec(ctx, `CREATE TABLE `+qt+` (id uuid NOT NULL PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
				aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload `+typ+`)`); err != nil {
				t.Fatal(err)
			}
			payload := `{"id": 1}`
			arg := any(payload)
			if typ == "bytea" {
				arg = []byte(payload)
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+qt+` VALUES ($1, 'Order', '1', 'OrderCreated', $2)`, id, arg); err != nil {
				t.Fatal(err)
			}
			table := outboxdriver.Table{Schema: schema, Name: "outboxevent"}
			if typ == "bytea" {
				table.Payload = outboxdriver.PayloadBytes
			}
			drv := outboxpgx.New(pool, &table)
			m, _ := drv.Migrator()
			if _, err := m.Migrate(ctx); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			store, _ := drv.Store()
			claimOne := func() outboxdriver.Claim {
				t.Helper()
				c, err := store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				if rows := c.Rows(); len(rows) != 1 || string(rows[0].Payload) != payload {
					t.Fatalf("claimed %+v", rows)
				}
				return c
			}
			c := claimOne()
			if err := c.Complete(ctx, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{{ID: id, Error: "413", CountAttempt: true, Dead: true}}}); err != nil {
				t.Fatalf("move to the dead letters: %v", err)
			}
			dead, err := store.ListDead(ctx, nil)
			if err != nil || len(dead) != 1 || string(dead[0].Payload) != payload {
				t.Fatalf("dead letters: %+v, %v", dead, err)
			}
			if n, err := store.ReplayDead(ctx, nil); err != nil || n != 1 {
				t.Fatalf("replay: %d, %v", n, err)
			}
			c = claimOne()
			if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: []string{id}, Completion: outboxdriver.CompleteArchive}); err != nil {
				t.Fatalf("archive: %v", err)
			}
			ev, err := store.Event(ctx, id)
			if err != nil || !ev.Archived || string(ev.Payload) != payload {
				t.Fatalf("archived event: %+v, %v", ev, err)
			}
		})
	}
}

// TestAdoptRefusesUnusableColumns: a table whose id is not a uuid, or whose payload
// has a type the relay cannot read, is refused by migrate in one line that names the
// column, and the migration leaves the table as it was.
func TestAdoptRefusesUnusableColumns(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	for _, tc := range []struct{ id, payload, want string }{
		{"varchar(36)", "jsonb", "column id is character varying(36), the relay needs uuid"},
		{"uuid", "integer", "column payload is integer, the relay needs"},
	} {
		schema := testenv.Schema(t, url)
		qt := pgx.Identifier{schema, "outbox"}.Sanitize()
		if _, err := pool.Exec(ctx, `CREATE TABLE `+qt+` (id `+tc.id+` PRIMARY KEY, aggregatetype text NOT NULL,
			aggregateid text NOT NULL, type text NOT NULL, payload `+tc.payload+`)`); err != nil {
			t.Fatal(err)
		}
		m, _ := outboxpgx.New(pool, &outboxdriver.Table{Schema: schema}).Migrator()
		_, err := m.Migrate(ctx)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("migrate a table with id %s, payload %s: %v; want one line saying %q", tc.id, tc.payload, err, tc.want)
		}
		var cols int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'outbox'`, schema).Scan(&cols); err != nil || cols != 5 {
			t.Fatalf("the refused table has %d columns (%v), want its own 5", cols, err)
		}
	}
}

// TestDeadLetterRefusedStaysWithItsRow: when the dead-letter table refuses a row (here
// a constraint of the operator's), the refusal is that row's: the batch's published
// event is still marked, and the row is kept for a retry a minute later with the
// refusal as its error, instead of the whole write-back failing and the batch going
// out again at once, for ever.
func TestDeadLetterRefusedStaysWithItsRow(t *testing.T) {
	t.Parallel()
	ctx, pool, drv, w, table := migratedTable(t)
	if _, err := pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{table.Schema, "outbox_dead"}.Sanitize()+
		" ADD CONSTRAINT no_bad CHECK (aggregateid <> 'bad')"); err != nil {
		t.Fatal(err)
	}
	evs := []outbox.Event{{AggregateType: "order", AggregateID: "good", Type: "T", Payload: []byte(`{}`)},
		{AggregateType: "order", AggregateID: "bad", Type: "T", Payload: []byte(`{}`)}}
	if err := w.Write(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	good, bad := evs[0], evs[1]
	store, _ := drv.Store()
	c, err := store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil || len(c.Rows()) != 2 {
		t.Fatalf("claim: %v", err)
	}
	start := time.Now()
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: []string{good.ID},
		Failed: []outboxdriver.Failure{{ID: bad.ID, Error: "413 Payload Too Large", CountAttempt: true, Dead: true, HoldKey: true}}}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if ev, err := store.Event(ctx, good.ID); err != nil || ev.State != outboxdriver.EventPublished {
		t.Fatalf("the good event: %+v, %v; want published", ev, err)
	}
	ev, err := store.Event(ctx, bad.ID)
	if err != nil || ev.State != outboxdriver.EventWaiting || ev.Attempts != 1 ||
		!strings.Contains(ev.Error, "the dead-letter table refused it") || !strings.Contains(ev.Error, "413 Payload Too Large") ||
		ev.AvailableAt.Before(start.Add(outboxdriver.DeadLetterRefusedRetry-time.Second)) {
		t.Fatalf("the refused event: %+v, %v; want it waiting a minute, one attempt, both errors", ev, err)
	}
}

// migratedTable migrates a table of the test's own and returns its pool, driver and
// writer.
func migratedTable(t *testing.T) (context.Context, *pgxpool.Pool, *outboxpgx.Driver, *outbox.Writer[pgx.Tx], outboxdriver.Table) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	table := outboxdriver.Table{Schema: testenv.Schema(t, url)}
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	w, _ := outbox.NewWriter(drv, nil)
	return ctx, pool, drv, w, table
}
