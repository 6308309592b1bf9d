package supervisor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/supervisor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// world is a SQLite file, a memory broker and a supervisor of its tables.
type world struct {
	db  *sql.DB
	pub *memory.Broker

	mu     sync.Mutex
	tables []outboxdriver.Table // what Find answers
	refuse map[string]error     // tables Open refuses, and why
}

func newWorld(t *testing.T) *world {
	t.Helper()
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &world{db: db, pub: memory.New(0), refuse: map[string]error{}}
}

func (w *world) setTables(ts ...outboxdriver.Table) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tables = ts
}

func (w *world) find(context.Context) ([]outboxdriver.Table, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]outboxdriver.Table(nil), w.tables...), nil
}

func (w *world) open(_ context.Context, t outboxdriver.Table) (*supervisor.Table, error) {
	w.mu.Lock()
	err := w.refuse[t.Name]
	w.mu.Unlock()
	if err != nil {
		return nil, err
	}
	store, err := outboxsqlite.New(w.db, &outboxsqlite.Options{Table: t}).Store()
	if err != nil {
		return nil, err
	}
	return &supervisor.Table{Source: store, Store: store}, nil
}

// run runs sup until the test ends.
func run(t *testing.T, sup *supervisor.Supervisor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil)
	req.Host = "127.0.0.1:9464" // the dashboard answers to loopback names, not httptest's example.com
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func write(t *testing.T, db *sql.DB, table outboxdriver.Table, id string) {
	t.Helper()
	drv := outboxsqlite.New(db, &outboxsqlite.Options{Table: table})
	m, err := drv.Migrator()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(t.Context(), outbox.Event{AggregateType: table.Name, AggregateID: id, Type: "Created", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, pub *memory.Broker, table outboxdriver.Table, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := pub.Wait(ctx, "outbox.event."+table.Name, n); err != nil {
		t.Fatalf("%d events of %s: %v", n, table, err)
	}
}

// TestFindFollowsTheTables: with Find, a table that appears is relayed at the next
// scan, one that goes is let go (and reported retired), and /readyz lists the
// tables relayed with their roles.
func TestFindFollowsTheTables(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b := outboxdriver.Table{Schema: "main", Name: "a_outbox"}, outboxdriver.Table{Schema: "main", Name: "b_outbox"}
	write(t, w.db, a, "1")
	w.setTables(a)
	sup, err := supervisor.New(&supervisor.Config{Find: w.find, Open: w.open, Publisher: w.pub, Rescan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := sup.Handler()
	if code, body := get(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Fatalf("/readyz before Run: %d %s", code, body)
	}
	run(t, sup)
	waitFor(t, w.pub, a, 1)

	write(t, w.db, b, "1")
	w.setTables(a, b)
	if err := sup.Scan(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, w.pub, b, 1)
	testenv.Wait(t, t.Context(), "both tables active", func() bool {
		code, body := get(t, h, "/readyz")
		return code == http.StatusOK && body == "ready (2 tables)\nmain.a_outbox active\nmain.b_outbox active\n"
	})

	w.setTables(b)
	if err := sup.Scan(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := sup.Tables(); len(got) != 1 || got[0].Name != "b_outbox" {
		t.Fatalf("tables after a went: %v", got)
	}
	if _, body := get(t, h, "/metrics"); !strings.Contains(body, `outbox_relay_table_retired{table="main.a_outbox"} 1`) ||
		strings.Contains(body, `outbox_relay_published_total{table="main.a_outbox"`) {
		t.Fatalf("/metrics after a went:\n%s", body)
	}
	write(t, w.db, b, "2")
	waitFor(t, w.pub, b, 2)
}

// TestFindRetriesATableThatCannotOpen: with Find, a table Open refuses is tried again
// at the next scan while the others are relayed.
func TestFindRetriesATableThatCannotOpen(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b := outboxdriver.Table{Schema: "main", Name: "a_outbox"}, outboxdriver.Table{Schema: "main", Name: "b_outbox"}
	write(t, w.db, a, "1")
	write(t, w.db, b, "1")
	w.setTables(a, b)
	w.refuse["b_outbox"] = errors.New("schema unknown")
	sup, err := supervisor.New(&supervisor.Config{Find: w.find, Open: w.open, Publisher: w.pub, Rescan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run(t, sup)
	waitFor(t, w.pub, a, 1)
	if got := sup.Tables(); len(got) != 1 {
		t.Fatalf("tables with b refused: %v", got)
	}
	w.mu.Lock()
	delete(w.refuse, "b_outbox")
	w.mu.Unlock()
	if err := sup.Scan(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, w.pub, b, 1)
}

// TestFixedTableThatCannotOpenEndsRun: a fixed table (Config.Tables) that cannot
// open ends Run with its error, and the tables opened before it are stopped.
func TestFixedTableThatCannotOpenEndsRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b := outboxdriver.Table{Schema: "main", Name: "a_outbox"}, outboxdriver.Table{Schema: "main", Name: "b_outbox"}
	refused := errors.New("schema unknown")
	w.refuse["b_outbox"] = refused
	sup, err := supervisor.New(&supervisor.Config{Tables: []outboxdriver.Table{a, b}, Open: w.open, Publisher: w.pub})
	if err != nil {
		t.Fatal(err)
	}
	err = sup.Run(t.Context())
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), "b_outbox") {
		t.Fatalf("Run: %v, want b_outbox's error", err)
	}
	if got := sup.Tables(); len(got) != 0 {
		t.Fatalf("relays left running: %v", got)
	}
}

// TestOneTableDashboard: a single fixed table's dashboard is that table's pages at
// /ui/, and /readyz names its role.
func TestOneTableDashboard(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := outboxdriver.Table{Schema: "main", Name: "a_outbox"}
	write(t, w.db, a, "1")
	sup, err := supervisor.New(&supervisor.Config{Tables: []outboxdriver.Table{a}, Open: w.open, Publisher: w.pub,
		Dashboard: &supervisor.DashboardConfig{Mode: "poll", Broker: "memory"}})
	if err != nil {
		t.Fatal(err)
	}
	h := sup.Handler()
	if code, _ := get(t, h, "/ui/"); code != http.StatusServiceUnavailable {
		t.Fatalf("/ui/ before Run: %d", code)
	}
	run(t, sup)
	waitFor(t, w.pub, a, 1)
	testenv.Wait(t, t.Context(), "the table's pages, its relay active", func() bool {
		code, body := get(t, h, "/ui/?partial=1")
		return code == http.StatusOK && strings.Contains(body, `id="relay-role">active<`)
	})
	var code int
	var body string
	testenv.WaitTell(t, t.Context(), "/readyz naming the table's role", func() bool {
		code, body = get(t, h, "/readyz")
		return code == http.StatusOK && body == "ready (1 table)\nmain.a_outbox active\n"
	}, func() string { return fmt.Sprint(code, " ", body) })
}

// TestConfigRefused: New says what is missing.
func TestConfigRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for name, cfg := range map[string]*supervisor.Config{
		"nil":     nil,
		"no open": {Tables: []outboxdriver.Table{{Name: "a"}}},
		"neither": {Open: w.open},
		"both":    {Open: w.open, Find: w.find, Tables: []outboxdriver.Table{{Name: "a"}}},
	} {
		if _, err := supervisor.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// needsOperator is a real store whose first leadership attempts fail as a lost CDC
// slot does (outboxdriver.ErrNeedsOperator): the relay stops on it.
type needsOperator struct {
	outboxdriver.Store
	fails *atomic.Int64
}

func (n needsOperator) AcquireLeadership(ctx context.Context, p *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	if n.fails.Add(-1) >= 0 {
		return nil, fmt.Errorf("planted: %w", outboxdriver.ErrNeedsOperator)
	}
	return n.Store.AcquireLeadership(ctx, p)
}

// TestRelayThatStops: a relay that stops on an error ends Run with it for a fixed
// table, and with Find is started again at the next scan, not at once (a relay that
// fails as it starts must not be restarted in a tight loop).
func TestRelayThatStops(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := outboxdriver.Table{Schema: "main", Name: "a_outbox"}
	write(t, w.db, a, "1")
	fails := &atomic.Int64{}
	open := func(ctx context.Context, t outboxdriver.Table) (*supervisor.Table, error) {
		tb, err := w.open(ctx, t)
		if err != nil {
			return nil, err
		}
		tb.Source = needsOperator{Store: tb.Store, fails: fails}
		return tb, nil
	}

	fails.Store(1)
	sup, err := supervisor.New(&supervisor.Config{Tables: []outboxdriver.Table{a}, Open: open, Publisher: w.pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := sup.Run(t.Context()); !errors.Is(err, outboxdriver.ErrNeedsOperator) {
		t.Fatalf("Run of a fixed table whose relay stopped: %v", err)
	}

	fails.Store(1)
	w.setTables(a)
	var logs testenv.Buffer
	sup, err = supervisor.New(&supervisor.Config{Find: w.find, Open: open, Publisher: w.pub, Rescan: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	run(t, sup)
	testenv.Wait(t, t.Context(), "the relay stopped", func() bool { return strings.Contains(logs.String(), "starting it again at the next rescan") })
	if got := len(w.pub.Messages()); got != 0 || fails.Load() != 0 {
		t.Fatalf("%d messages, %d leadership attempts past the planted one: the relay was started again at once", got, -fails.Load())
	}
	if err := sup.Scan(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, w.pub, a, 1)
}
