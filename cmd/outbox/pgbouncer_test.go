package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outbox/internal/testenv"
)

// startPgBouncer runs Debian's pgbouncer in front of the machine's PostgreSQL with two
// databases, "tx" (pool_mode = transaction) and "session", and returns its port.
func startPgBouncer(t *testing.T) int {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			testenv.Missing(t, "pgbouncer (Debian's pgbouncer package): %v", err)
		}
	}
	testenv.DatabaseURL(t) // PostgreSQL answers (or the test skips)
	dir := t.TempDir()
	port := testenv.FreePort(t)
	conf := fmt.Sprintf(`[databases]
tx = host=127.0.0.1 port=5432 dbname=test pool_mode=transaction
session = host=127.0.0.1 port=5432 dbname=test pool_mode=session
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s/users.txt
default_pool_size = 4
pidfile = %s/pgbouncer.pid
logfile = %s/pgbouncer.log
`, port, dir, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		// pgbouncer refuses to run as root: as the postgres user, which must read
		// and write the directory.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("pgbouncer will not run as root, and there is no postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.ini")} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(bin, args...)
	out := &lockedWriter{w: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testenv.WaitTell(t, context.Background(), "pgbouncer listening", func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, func() string {
		log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
		out.mu.Lock()
		defer out.mu.Unlock()
		return out.w.String() + string(log)
	})
	return port
}

// TestPgBouncer: through a transaction-pooling PgBouncer the relay refuses to start,
// in one line naming the fix (its leadership lock and LISTEN need a session); with
// --leader-db, a direct URL for those, it relays through the pooler; through session
// pooling it relays as on a direct connection.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	port := startPgBouncer(t)
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	tx := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/tx", port)
	session := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/session", port)

	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	name := table.Schema + "." + table.Name
	_, stderr, code := runCLI(t, nil, "relay", "--db", tx, "--table", name, "--broker", "stdout:", "--http", "")
	if code != 2 || !strings.Contains(stderr, "transaction-pooling proxy") || !strings.Contains(stderr, "--leader-db") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("relay through transaction pooling: exit %d\n%s", code, stderr)
	}
	_, stderr, code = runCLI(t, nil, "relay", "--db", tx, "--leader-db", tx, "--table", name, "--broker", "stdout:", "--http", "")
	if code != 2 || !strings.Contains(stderr, "--leader-db") || !strings.Contains(stderr, "too") {
		t.Fatalf("relay with a pooled --leader-db: exit %d\n%s", code, stderr)
	}

	for _, tc := range []struct{ name, db, leader string }{
		{"transaction pooling with --leader-db", tx, url},
		{"session pooling", session, ""},
	} {
		table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
		want := writeEvents(t, pool, table, 3, 30)
		args := []string{"--db", tc.db, "--table", table.Schema + "." + table.Name, "--broker", "stdout:", "--log-level", "error", "--http", ""}
		if tc.leader != "" {
			args = append(args, "--leader-db", tc.leader)
		}
		p := startRelayProc(t, nil, args...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		testenv.WaitTell(t, ctx, tc.name+": 30 events relayed", func() bool { return strings.Count(p.output(), "\n") >= 30 }, p.output)
		cancel()
		waitUnpublished(t, pool, table, 0, 30*time.Second)
		if !strings.Contains(p.output(), want["agg-0"][0]) {
			t.Fatalf("%s: the first event is missing:\n%s", tc.name, p.output())
		}
	}

	// Many tables through transaction pooling: refused without --leader-db, relayed
	// with it (the shared sessions on the direct URL, the claims through the pooler).
	prefix := testenv.UniqueName("pb")
	tables := prefixedTables(t, pool, url, prefix, 2)
	_, stderr, code = runCLI(t, nil, "relay", "--db", tx, "--tables", prefix+"_*.outbox", "--broker", "stdout:", "--http", "")
	if code != 2 || !strings.Contains(stderr, "transaction-pooling proxy") || !strings.Contains(stderr, "--leader-db") {
		t.Fatalf("relay --tables through transaction pooling: exit %d\n%s", code, stderr)
	}
	p := startRelayProc(t, nil, "--db", tx, "--leader-db", url, "--tables", prefix+"_*.outbox", "--broker", "stdout:", "--log-level", "error", "--http", "")
	for _, table := range tables {
		writeEvents(t, pool, table, 3, 30)
	}
	for _, table := range tables {
		waitUnpublished(t, pool, table, 0, 30*time.Second)
	}
	if n := strings.Count(p.output(), "\n"); n < 60 {
		t.Fatalf("--tables through the pooler: %d lines, want the 60 events:\n%s", n, p.output())
	}
}
