package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/inbox/natsinbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// TestOrderBehindHeldRow: another session holds the first event of aggregate a
// (SELECT … FOR UPDATE, as an operator fixing a row would). The relay publishes b1,
// never a2 before a1, and once the lock goes, a1 then a2; a consumer's version guard
// handles all three. In every completion mode, and in a group. (CDC mode: see
// TestOrderBehindHeldRowCDC.)
func TestOrderBehindHeldRow(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	for name, mode := range map[string][]string{
		"mark": {"--completion", "mark"}, "delete": {"--completion", "delete"}, "archive": {"--completion", "archive"},
		"group": {"--group", "--relay-id", "r1", "--partition-lease", "2s"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
			ns := newNATSScope(t)
			a1 := writeOne(t, pool, table, "a")
			a2 := writeOne(t, pool, table, "a")
			b1 := writeOne(t, pool, table, "b")
			release := holdRow(t, pool, table, a1)
			heldRowOrder(t, ns, pool, append([]string{"--db", url, "--table", table.Schema + "." + table.Name}, mode...), release, a1, a2, b1)
		})
	}
}

// TestOrderBehindHeldRowMariaDB: the same on MariaDB, with the row held by another
// session's SELECT … FOR UPDATE.
func TestOrderBehindHeldRowMariaDB(t *testing.T) {
	t.Parallel()
	db, name := testenv.MariaDB(t, "outbox_")
	url := "mysql://root@127.0.0.1:3306/test"
	if _, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", name); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	pool := testenv.Pool(t, testenv.DatabaseURL(t)) // the consumer's inbox
	ns := newNATSScope(t)
	table := outboxdriver.Table{Name: name}
	w, err := outbox.NewWriter(outboxmysql.New(db, &table), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	write := func(agg string) string {
		evs := []outbox.Event{{AggregateType: "order", AggregateID: agg, Type: "Step", Payload: []byte(`{}`)}}
		if err := w.Write(ctx, evs...); err != nil {
			t.Fatal(err)
		}
		return evs[0].ID
	}
	a1, a2, b1 := write("a"), write("a"), write("b")
	release, err := testenv.HoldRow(db, "`"+name+"`", "LOCK IN SHARE MODE", "?")(ctx, a1, outboxdrivertest.LockForUpdate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	heldRowOrder(t, ns, pool, []string{"--db", url, "--table", name}, release, a1, a2, b1)
}

// heldRowOrder starts a relay with args while a1 is held, and checks that b1 goes
// out first, then, once release let a1 go, a1 and a2, and that a consumer's version
// guard handles all three.
func heldRowOrder(t *testing.T, ns *natsScope, pool *pgxpool.Pool, args []string, release func(), a1, a2, b1 string) {
	t.Helper()
	startRelayProc(t, nil, append(args, "--broker", ns.url, "--topic-template", ns.template(), "--poll-interval", "50ms")...)
	if first := ns.read(t, 1); first[0].ID != b1 {
		t.Fatalf("first published %s, want b1 %s (a1 %s is held, a2 %s must wait behind it)", first[0].ID, b1, a1, a2)
	}
	release()
	got := ns.read(t, 3)
	if ids := []string{got[1].ID, got[2].ID}; fmt.Sprint(ids) != fmt.Sprint([]string{a1, a2}) {
		t.Fatalf("after the lock: %v, want a1 a2 %v", ids, []string{a1, a2})
	}
	if handled := consumeGuarded(t, ns, pool, 3); fmt.Sprint(handled) != fmt.Sprint([]string{b1, a1, a2}) {
		t.Fatalf("the version guard handled %v, want all three %v", handled, []string{b1, a1, a2})
	}
}

// TestOrderBehindHeldRowCDC: in CDC mode the stream reads committed rows from the
// WAL, where no row lock reaches: with a1 held, a1, a2 and b1 all go out, a1 before
// a2, and the version guard handles all three.
func TestOrderBehindHeldRowCDC(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table, _ := cdcTable(t, url, pool)
	ns := newNATSScope(t)
	a1 := writeOne(t, pool, table, "a")
	a2 := writeOne(t, pool, table, "a")
	b1 := writeOne(t, pool, table, "b")
	holdRow(t, pool, table, a1)
	startRelayProc(t, nil, "--db", url, "--table", table.Schema+"."+table.Name, "--broker", ns.url, "--mode", "cdc",
		"--topic-template", ns.template())
	got := ns.read(t, 3)
	if ids := []string{got[0].ID, got[1].ID, got[2].ID}; fmt.Sprint(ids) != fmt.Sprint([]string{a1, a2, b1}) {
		t.Fatalf("published %v with a1 held, want a1 a2 b1 %v", ids, []string{a1, a2, b1})
	}
	if handled := consumeGuarded(t, ns, pool, 3); fmt.Sprint(handled) != fmt.Sprint([]string{a1, a2, b1}) {
		t.Fatalf("the version guard handled %v, want all three", handled)
	}
}

// TestLateCommitReachesHandler: two writers of one aggregate commit opposite to their
// inserts. The later-inserted event is published first (nothing can see an
// uncommitted row); the earlier one follows marked outbox-late: committed-late, and a
// consumer's version guard hands it to the handler instead of dropping it as stale.
// In poll and in CDC mode.
func TestLateCommitReachesHandler(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			lateCommit(t, mode)
		})
	}
}

func lateCommit(t *testing.T, mode string) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := modeTable(t, url, pool, mode)
	ns := newNATSScope(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(outboxpgx.New(pool, &table), nil)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = slow.Rollback(ctx) }()
	evs := []outbox.Event{{AggregateType: "order", AggregateID: "a", Type: "Step", Payload: []byte(`{}`)}}
	if err := w.WriteTx(ctx, slow, evs...); err != nil {
		t.Fatal(err)
	}
	early := evs[0].ID
	second := writeOne(t, pool, table, "a")
	startRelayProc(t, nil, "--db", url, "--table", table.Schema+"."+table.Name, "--broker", ns.url, "--mode", mode,
		"--topic-template", ns.template(), "--poll-interval", "50ms")
	if first := ns.read(t, 1); first[0].ID != second {
		t.Fatalf("first published %s, want the committed %s", first[0].ID, second)
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := ns.read(t, 2)
	if got[1].ID != early || got[1].Headers[broker.HeaderLate] != "committed-late" {
		t.Fatalf("second published %s with %s=%q, want %s marked committed-late", got[1].ID, broker.HeaderLate, got[1].Headers[broker.HeaderLate], early)
	}
	if handled := consumeGuarded(t, ns, pool, 2); fmt.Sprint(handled) != fmt.Sprint([]string{second, early}) {
		t.Fatalf("the version guard handled %v, want both %v", handled, []string{second, early})
	}
}

// writeOne commits one event of aggregate agg alone and returns its id.
func writeOne(t *testing.T, pool *pgxpool.Pool, table outboxdriver.Table, agg string) string {
	t.Helper()
	w, err := outbox.NewWriter(outboxpgx.New(pool, &table), nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Step", Payload: []byte(`{}`)}
	ctx := context.Background()
	evs := []outbox.Event{ev} // the writer fills in the id
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
		t.Fatal(err)
	}
	return evs[0].ID
}

// holdRow locks event id's row from a session of its own until release.
func holdRow(t *testing.T, pool *pgxpool.Pool, table outboxdriver.Table, id string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT * FROM "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+" WHERE id = $1 FOR UPDATE", id); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	release = func() { _ = tx.Rollback(ctx) }
	t.Cleanup(release)
	return release
}

// consumeGuarded reads n messages of ns's stream through natsinbox with the version
// guard on, and returns the ids its handler ran for, in order.
func consumeGuarded(t *testing.T, ns *natsScope, pool *pgxpool.Pool, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ib, err := inbox.NewPgx(pool, &inbox.Config{Table: "inbox_" + ns.stream[len(ns.stream)-8:], VersionGuard: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := natsgo.Connect(ns.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, ns.stream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var handled []string
	seen := make(chan struct{}, n)
	consumed := make(chan error, 1)
	cctx, stop := context.WithCancel(ctx)
	go func() {
		consumed <- natsinbox.Consume(cctx, cons, ib, "guarded", func(_ context.Context, _ pgx.Tx, m *inbox.Message) error {
			handled = append(handled, m.ID)
			seen <- struct{}{}
			return nil
		}, nil)
	}()
	for range n {
		select {
		case <-seen:
		case <-ctx.Done():
			stop()
			<-consumed
			t.Fatalf("the handler ran for %v, want %d events (the guard dropped the rest)", handled, n)
		}
	}
	stop()
	if err := <-consumed; err != nil {
		t.Fatal(err)
	}
	return handled
}
