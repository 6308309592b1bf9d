// Package testenv gives tests the real services of the machine: a PostgreSQL schema of
// their own and the NATS server. A missing service skips the test on a laptop, and
// fails it under CI (CI=true), where a skip would hide a broken setup.
package testenv

import (
	"context"
	"database/sql"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // SQL's driver

	"github.com/outboxd/outbox/internal/testname"
)

// Defaults, overridden by TEST_DATABASE_URL and TEST_NATS_URL.
const (
	DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

// Missing skips t, or fails it under CI.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("service missing under CI: "+format, args...)
	}
	t.Skipf("service missing: "+format, args...)
}

// DatabaseURL returns the test database URL after checking it answers.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = DatabaseURLDefault
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		Missing(t, "PostgreSQL at %s: %v", url, err)
	}
	_ = conn.Close(ctx)
	return url
}

// Schema creates a schema of the test's own, dropped when the test ends.
func Schema(t testing.TB, url string) string {
	t.Helper()
	name := UniqueName("outbox_test_")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("drop schema %s: %v", name, err)
			return
		}
		defer func() { _ = conn.Close(ctx) }()
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// Pool returns a pool on url, closed when the test ends.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// UniqueName returns prefix plus random lowercase hex.
func UniqueName(prefix string) string { return testname.Unique(prefix) }

// ServiceURL returns the URL in env (or def) after checking that addr accepts TCP
// connections; a closed port is a missing service.
func ServiceURL(t testing.TB, env, def, addr, name string) string {
	t.Helper()
	url := os.Getenv(env)
	if url == "" {
		url = def
	}
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		Missing(t, "%s at %s: %v", name, addr, err)
	}
	_ = c.Close()
	return url
}

// FreePort returns a TCP port on loopback that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// QuietLogger drops everything below errors+4 (nothing the relay logs), unless
// TEST_DEBUG is set: then it logs everything to stderr.
func QuietLogger() *slog.Logger {
	if os.Getenv("TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// SQL returns a database/sql handle (pgx's stdlib driver) on url, closed when the
// test ends.
func SQL(t testing.TB, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
