package outboxmysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tableName opens the machine's MariaDB and names a table the test's end drops, with
// the tables made beside it.
func tableName(t *testing.T) (*sql.DB, string) {
	t.Helper()
	return testenv.MariaDB(t, "outbox_")
}

// TestConformance runs the driver suite on the machine's MariaDB.
func TestConformance(t *testing.T) {
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[*sql.Tx] {
		t.Helper()
		db, name := tableName(t)
		return &outboxdrivertest.Harness[*sql.Tx]{
			Driver:   outboxmysql.New(db, &outboxdriver.Table{Name: name, Payload: payload}),
			Begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
			Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
			InsertPlain: func(ctx context.Context, id, at, aid, typ, payload string) error {
				_, err := db.ExecContext(ctx, "INSERT INTO `"+name+"` (id, aggregatetype, aggregateid, type, payload) VALUES (?, ?, ?, ?, ?)", id, at, aid, typ, payload)
				return err
			},
			Reopen:            func(t outboxdriver.Table) outboxdriver.Driver[*sql.Tx] { return outboxmysql.New(db, &t) },
			HoldRow:           testenv.HoldRow(db, "`"+name+"`", "LOCK IN SHARE MODE", "?"),
			MultipleClaims:    true,
			ConcurrentWriters: true,
		}
	})
}

// A table made without the migrations table (by hand, or before it existed) has no
// claim fence: the relay still claims and leads, as before.
func TestRelaysWithoutMigrationsTable(t *testing.T) {
	db, name := tableName(t)
	ctx := context.Background()
	d := outboxmysql.New(db, &outboxdriver.Table{Name: name})
	m, _ := d.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE `"+name+"_migrations`"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO `"+name+"` (id, aggregatetype, aggregateid, type, payload) VALUES (UUID(), 'order', 'o-1', 'T', '{}')"); err != nil {
		t.Fatal(err)
	}
	s, _ := d.Store()
	l, err := s.AcquireLeadership(ctx, &outboxdriver.LeadershipParams{Timeout: 5 * time.Second})
	if err != nil || l == nil {
		t.Fatalf("leadership: %v, %v", l, err)
	}
	defer l.Release(ctx)
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10, HoldTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx)
	if n := len(c.Rows()); n != 1 {
		t.Fatalf("claimed %d rows, want 1", n)
	}
}
