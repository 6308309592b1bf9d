package outboxmysql_test

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the driver suite on the machine's MariaDB.
func TestConformance(t *testing.T) {
	dsn := testenv.ServiceURL(t, "TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true", "127.0.0.1:3306", "MariaDB")
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[*sql.Tx] {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		name := testenv.UniqueName("outbox_")
		t.Cleanup(func() {
			for _, tbl := range []string{name, name + "_dead", name + "_migrations"} {
				_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+tbl+"`")
			}
			_ = db.Close()
		})
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
			MultipleClaims:    true,
			ConcurrentWriters: true,
		}
	})
}
