package sqltx_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver/internal/sqltx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCommitBounded: a COMMIT sent into a black hole returns at the caller's
// deadline, outcome unknown, instead of waiting for the connection; once the
// network heals, the COMMIT lands.
func TestCommitBounded(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	cfg := pool.Config().ConnConfig
	proxy := testenv.NewProxy(t, net.JoinHostPort(cfg.Host, "5432"))
	db, err := sql.Open("pgx", strings.Replace(url, net.JoinHostPort(cfg.Host, "5432"), proxy.Addr(), 1))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	table := testenv.UniqueName("sqltx_")
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (n int)"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) }()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := sqltx.Commit(cctx, tx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("commit into a black hole: %v, want the deadline", err)
	}
	proxy.Heal()
	testenv.Wait(t, ctx, "the commit to land once healed", func() bool {
		var n int
		return pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n) == nil && n == 1
	})
}
