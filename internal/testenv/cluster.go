package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Cluster is a PostgreSQL server of a test's own (initdb in a temporary directory, on
// a free port, wal_level=logical), for tests that restart or crash the server: the
// machine's shared server must stay up for the other tests.
type Cluster struct {
	URL      string
	bin, dir string
	port     int
	asUser   string // run the server as this user (initdb refuses root)
}

// NewCluster starts a private server, stopped when the test ends. It is missing
// (skipped, or failed under CI) when PostgreSQL's server binaries are not installed.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := os.Getenv("TEST_PG_BIN")
	if bin == "" {
		matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		if len(matches) > 0 {
			bin = matches[len(matches)-1]
		}
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		Missing(t, "PostgreSQL server binaries (initdb, pg_ctl) not found; set TEST_PG_BIN")
	}
	root, err := os.MkdirTemp("", "outbox-pg-") //nolint:usetesting // the postgres user must reach it, and t.TempDir's parents are private to root
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	c := &Cluster{bin: bin, dir: filepath.Join(root, "data"), port: FreePort(t)}
	if os.Geteuid() == 0 {
		c.asUser = "postgres"
		u, err := user.Lookup(c.asUser)
		if err != nil {
			Missing(t, "running as root and there is no postgres user to run a private server")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chmod(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(c.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(c.dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c.run(t, "initdb", "-D", c.dir, "-A", "trust", "-U", "postgres", "--no-sync")
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\nwal_level = logical\nfsync = off\nmax_wal_senders = 4\nmax_replication_slots = 4\n", c.port)
	if err := os.WriteFile(filepath.Join(c.dir, "postgresql.auto.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	c.Start(t)
	t.Cleanup(func() { c.Stop(t, "immediate") })
	return c
}

func (c *Cluster) run(t testing.TB, tool string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, tool), args...)
	if c.asUser != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.asUser, "--", filepath.Join(c.bin, tool)}, args...)...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", tool, err, out)
	}
}

// Start starts the server and waits until it accepts connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	c.run(t, "pg_ctl", "-D", c.dir, "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "start")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.URL)
		if err == nil {
			_ = conn.Close(ctx)
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("private PostgreSQL did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond) //nolint:forbidigo // polls the private server until it takes connections; ctx bounds it
	}
}

// Stop stops the server: mode "fast" (clean shutdown) or "immediate" (like a crash:
// recovery from the WAL at the next start).
func (c *Cluster) Stop(t testing.TB, mode string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, "pg_ctl"), "-D", c.dir, "-m", mode, "-w", "stop")
	if c.asUser != "" {
		cmd = exec.Command("runuser", "-u", c.asUser, "--", filepath.Join(c.bin, "pg_ctl"), "-D", c.dir, "-m", mode, "-w", "stop")
	}
	_ = cmd.Run() // already stopped is fine
}

// LogicalReplication checks the server behind pool has wal_level=logical: the CDC
// tests are missing without it (.ci/run sets it).
func LogicalReplication(t testing.TB, pool interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) {
	t.Helper()
	var level string
	if err := pool.QueryRow(context.Background(), "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		Missing(t, "PostgreSQL has wal_level=%s; the CDC tests need logical (.ci/run sets it)", level)
	}
}

// DropSlot drops a replication slot and its publication of the same name, waiting
// while the slot is still active (its walsender ending): a forgotten slot pins WAL.
func DropSlot(ctx context.Context, pool interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("drop slot %s: %w", slot, err)
		}
		time.Sleep(100 * time.Millisecond) //nolint:forbidigo // polls until the slot's walsender has left; ctx bounds it
	}
	_, err := pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{slot}.Sanitize())
	return err
}
