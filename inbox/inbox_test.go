package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// suite runs the inbox's behaviour against one database. bump adds one to the
// business counter inside tx; count reads it.
type suite[TTx any] struct {
	newInbox func(t *testing.T, guard bool) *inbox.Inbox[TTx]
	bump     func(ctx context.Context, tx TTx) error
	count    func(t *testing.T) int
}

func run[TTx any](t *testing.T, s suite[TTx]) {
	t.Helper()
	t.Run("ConcurrentRedeliveryChangesStateOnce", func(t *testing.T) {
		ib := s.newInbox(t, false)
		base := s.count(t)
		msg := &inbox.Message{ID: testenv.UniqueName("ev-"), AggregateType: "order", AggregateID: "1", Type: "OrderPlaced"}
		var wg sync.WaitGroup
		var mu sync.Mutex
		outcomes := map[inbox.Outcome]int{}
		for i := 0; i < 12; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o, err := ib.Handle(context.Background(), "billing", msg, s.bump)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				outcomes[o]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		if outcomes[inbox.Processed] != 1 || outcomes[inbox.Duplicate] != 11 {
			t.Fatalf("outcomes = %v, want 1 processed and 11 duplicates", outcomes)
		}
		if got := s.count(t) - base; got != 1 {
			t.Fatalf("state changed %d times, want once", got)
		}
		// Another consumer processes it independently.
		if o, err := ib.Handle(context.Background(), "shipping", msg, s.bump); err != nil || o != inbox.Processed {
			t.Fatalf("another consumer: %v, %v", o, err)
		}
	})
	t.Run("HandlerErrorRollsBack", func(t *testing.T) {
		ib := s.newInbox(t, false)
		base := s.count(t)
		msg := &inbox.Message{ID: testenv.UniqueName("ev-"), AggregateType: "order", AggregateID: "1"}
		boom := errors.New("boom")
		_, err := ib.Handle(context.Background(), "billing", msg, func(ctx context.Context, tx TTx) error {
			if err := s.bump(ctx, tx); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want the handler's", err)
		}
		if got := s.count(t) - base; got != 0 {
			t.Fatalf("a failed handler changed state (%d)", got)
		}
		if o, err := ib.Handle(context.Background(), "billing", msg, s.bump); err != nil || o != inbox.Processed {
			t.Fatalf("redelivery after a failure: %v, %v; want processed", o, err)
		}
		if got := s.count(t) - base; got != 1 {
			t.Fatalf("state changed %d times, want once", got)
		}
	})
	t.Run("VersionGuard", func(t *testing.T) {
		ib := s.newInbox(t, true)
		base := s.count(t)
		handle := func(seq int64) inbox.Outcome {
			msg := &inbox.Message{ID: testenv.UniqueName("ev-"), AggregateType: "order", AggregateID: "7", Seq: seq}
			o, err := ib.Handle(context.Background(), "billing", msg, s.bump)
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		if o := handle(5); o != inbox.Processed {
			t.Fatalf("seq 5: %v", o)
		}
		if o := handle(3); o != inbox.Stale {
			t.Fatalf("seq 3 after 5: %v, want stale", o)
		}
		if o := handle(7); o != inbox.Processed {
			t.Fatalf("seq 7: %v", o)
		}
		if got := s.count(t) - base; got != 2 {
			t.Fatalf("state changed %d times, want twice", got)
		}
	})
	t.Run("PruneAndNoID", func(t *testing.T) {
		ib := s.newInbox(t, false)
		ctx := context.Background()
		for i := 0; i < 5; i++ {
			msg := &inbox.Message{ID: testenv.UniqueName("ev-"), AggregateType: "order", AggregateID: "1"}
			if _, err := ib.Handle(ctx, "billing", msg, s.bump); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := ib.Prune(ctx, time.Hour, 0); err != nil || n != 0 {
			t.Fatalf("prune of records older than an hour: %d, %v", n, err)
		}
		if n, err := ib.Prune(ctx, time.Nanosecond, 2); err != nil || n != 5 {
			t.Fatalf("prune everything in batches of 2: %d, %v", n, err)
		}
		if _, err := ib.Handle(ctx, "billing", &inbox.Message{}, s.bump); !errors.Is(err, inbox.ErrNoID) {
			t.Fatalf("no id: %v", err)
		}
	})
}

func TestPgx(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	counter := testenv.UniqueName("counter_")
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+counter+" (id int PRIMARY KEY, n int NOT NULL); INSERT INTO "+counter+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+counter) })
	run(t, suite[pgx.Tx]{
		newInbox: func(t *testing.T, guard bool) *inbox.Inbox[pgx.Tx] {
			t.Helper()
			table := testenv.UniqueName("inbox_")
			ib, err := inbox.NewPgx(pool, &inbox.Config{Table: table, VersionGuard: guard})
			if err != nil {
				t.Fatal(err)
			}
			if err := ib.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table+", "+table+"_versions") })
			return ib
		},
		bump: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE "+counter+" SET n = n + 1")
			return err
		},
		count: func(t *testing.T) int {
			t.Helper()
			var n int
			if err := pool.QueryRow(ctx, "SELECT n FROM "+counter).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	})
}

func sqlSuite(t *testing.T, db *sql.DB, d inbox.Dialect) suite[*sql.Tx] {
	t.Helper()
	ctx := context.Background()
	counter := testenv.UniqueName("counter_")
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+counter+" (id int PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+counter+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE "+counter) })
	return suite[*sql.Tx]{
		newInbox: func(t *testing.T, guard bool) *inbox.Inbox[*sql.Tx] {
			t.Helper()
			table := testenv.UniqueName("inbox_")
			ib, err := inbox.NewSQL(db, d, &inbox.Config{Table: table, VersionGuard: guard})
			if err != nil {
				t.Fatal(err)
			}
			if err := ib.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_, _ = db.ExecContext(context.Background(), "DROP TABLE "+table)
				_, _ = db.ExecContext(context.Background(), "DROP TABLE "+table+"_versions")
			})
			return ib
		},
		bump: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "UPDATE "+counter+" SET n = n + 1")
			return err
		},
		count: func(t *testing.T) int {
			t.Helper()
			var n int
			if err := db.QueryRowContext(ctx, "SELECT n FROM "+counter).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

func TestDatabaseSQLPostgres(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	run(t, sqlSuite(t, db, inbox.Postgres))
}

func TestMariaDB(t *testing.T) {
	t.Parallel()
	dsn := testenv.ServiceURL(t, "TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true", "127.0.0.1:3306", "MariaDB")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	run(t, sqlSuite(t, db, inbox.MySQL))
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	run(t, sqlSuite(t, db, inbox.SQLite))
}

func TestBadConfig(t *testing.T) {
	t.Parallel()
	db, _ := sql.Open("pgx", "postgres://127.0.0.1:1/x")
	defer db.Close()
	if _, err := inbox.NewSQL(db, inbox.Postgres, &inbox.Config{Table: "inbox; DROP TABLE x"}); err == nil {
		t.Error("bad table name accepted")
	}
	if _, err := inbox.NewSQL(db, "oracle", nil); err == nil {
		t.Error("unknown dialect accepted")
	}
	if _, err := inbox.NewPgx(nil, nil); err == nil {
		t.Error("nil pool accepted")
	}
}

func TestFromHeaders(t *testing.T) {
	t.Parallel()
	m := inbox.FromHeaders(map[string]string{"Id": "e1", "eventType": "T", "aggregateType": "order", "aggregateId": "7", "outbox-seq": "42"}, []byte("{}"))
	if m.ID != "e1" || m.Type != "T" || m.AggregateType != "order" || m.AggregateID != "7" || m.Seq != 42 {
		t.Fatalf("%+v", m)
	}
}
