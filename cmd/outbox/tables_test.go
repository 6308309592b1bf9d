package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// TestManyTables: `migrate --tables` creates the tables it names and upgrades those
// its patterns match, `status --tables` shows one line per table and `dlq list
// --tables` every table's dead letters with their table (JSON too), and a bad pattern, a pattern that matches nothing and --tables beside --table are
// refused with one line each.
func TestManyTables(t *testing.T) {
	url := testenv.DatabaseURL(t)
	a, b := testenv.Schema(t, url), testenv.Schema(t, url)
	prefix := a[:len("outbox_test_")]
	// Two names, created.
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", a+".outbox, "+b+".outbox")
	if code != 0 || !strings.Contains(stdout, a+".outbox: applied migrations") || !strings.Contains(stdout, b+".outbox: applied migrations") {
		t.Fatalf("migrate --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	// A pattern finds both (and whatever other tests' schemas hold: not asserted).
	stdout, stderr, code = runCLI(t, nil, "migrate", "--db", url, "--tables", a+".*,"+b+".out*")
	if code != 0 || !strings.Contains(stdout, a+".outbox is up to date") || !strings.Contains(stdout, b+".outbox is up to date") {
		t.Fatalf("migrate --tables pattern: exit %d\n%s%s", code, stdout, stderr)
	}
	// Events in one table, none in the other.
	pool := testenv.Pool(t, url)
	w, err := outbox.NewWriter(outboxpgx.New(pool, &outboxdriver.Table{Schema: b}), nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := w.Write(context.Background(), outbox.Event{AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	tables := a + ".outbox," + b + ".*"
	stdout, stderr, code = runCLI(t, nil, "status", "--db", url, "--tables", tables)
	unpublished := map[string]string{} // table -> its UNPUBLISHED column
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 1 {
			unpublished[f[0]] = f[1]
		}
	}
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "TABLE") || unpublished[a+".outbox"] != "0" || unpublished[b+".outbox"] != "3" {
		t.Fatalf("status --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, _, code = runCLI(t, nil, "status", "--db", url, "--tables", tables, "--json")
	var got struct {
		Tables []struct {
			Table       string `json:"table"`
			Unpublished int64  `json:"unpublished"`
		} `json:"tables"`
	}
	err = json.Unmarshal([]byte(stdout), &got)
	if err != nil || code != 0 || len(got.Tables) != 2 || got.Tables[0].Unpublished+got.Tables[1].Unpublished != 3 {
		t.Fatalf("status --tables --json: exit %d, %v\n%s", code, err, stdout)
	}
	// A dead letter in b's table: dlq list --tables names its table.
	id := uuid.NewString()
	if _, err := pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{b, "outbox_dead"}.Sanitize()+
		` (id, aggregatetype, aggregateid, type, payload, seq, created_at, attempts, error, holds_key)
VALUES ($1, 'order', '9', 'T', '{}', 1, now(), 1, 'refused', true)`, id); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = runCLI(t, nil, "dlq", "list", "--db", url, "--tables", tables)
	if lines := strings.Split(strings.TrimSpace(stdout), "\n"); code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "TABLE") ||
		!strings.HasPrefix(lines[1], b+".outbox") || !strings.Contains(lines[1], id) {
		t.Fatalf("dlq list --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, _, code = runCLI(t, nil, "dlq", "list", "--db", url, "--tables", tables, "--json")
	var dead []struct{ Table, ID string }
	if err := json.Unmarshal([]byte(stdout), &dead); err != nil || code != 0 || len(dead) != 1 || dead[0].Table != b+".outbox" || dead[0].ID != id {
		t.Fatalf("dlq list --tables --json: exit %d, %v\n%s", code, err, stdout)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--db", url, "--tables", prefix + "x-y.outbox"}, "--tables: invalid identifier"},
		{[]string{"status", "--db", url, "--tables", "a,,b"}, "empty table"},
		{[]string{"status", "--db", url, "--tables", a + ".outbox", "--table", a + ".outbox"}, "--table and --tables"},
		{[]string{"migrate", "--db", url, "--tables", a + ".nothing_*"}, "no outbox table matches"},
		{[]string{"migrate", "--db", url, "--tables", a + ".outbox", "--cdc", "--drop-cdc"}, "give one of them"},
		{[]string{"migrate", "--db", "sqlite://" + t.TempDir() + "/x.db", "--tables", "outbox", "--cdc"}, "need PostgreSQL"},
		{[]string{"dlq", "purge", "--db", url, "--tables", a + ".outbox", "--all"}, "flag provided but not defined: -tables"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--tables", a + ".outbox", "--table", a + ".outbox"}, "--table and --tables"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--tables", a + ".outbox", "--park-after", "1s"}, "--park-after goes with --mode cdc"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--park-after", "1s", "--mode", "cdc"}, "go with --tables"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--tables", a + ".outbox", "--max-spilled", "10"}, "--max-spilled goes with --mode cdc"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--max-spilled", "10", "--mode", "cdc"}, "go with --tables"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--tables", a + ".outbox", "--mode", "cdc", "--max-spilled", "-1"}, "--max-spilled -1: want a count"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--tables", a + ".outbox", "--max-conns", "2"}, "at least 3"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--max-conns", "5"}, "go with --tables"},
		{[]string{"relay", "--db", url, "--broker", "stdout:", "--tables", "a,,b"}, "empty table"},
		{[]string{"relay", "--db", "sqlite://" + t.TempDir() + "/x.db", "--broker", "stdout:", "--tables", "outbox"}, "--tables needs PostgreSQL"},
	} {
		_, stderr, code := runCLI(t, nil, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("outbox %s: exit %d, want 2 and one line with %q:\n%s", strings.Join(tc.args, " "), code, tc.want, stderr)
		}
	}
	stdout, _, _ = runCLI(t, nil, "status", "--db", url, "--tables", a+".nothing_*")
	if !strings.Contains(stdout, "no outbox table matches") {
		t.Errorf("status of no table: %s", stdout)
	}
}

// TestManyTablesMySQL: --tables on MariaDB, where a pattern's schema is a database:
// migrate creates the tables named in two databases, status and dlq list find them
// by pattern (and a name without a database is the URL's).
func TestManyTablesMySQL(t *testing.T) {
	testenv.ServiceURL(t, "TEST_MYSQL_DSN", "", "127.0.0.1:3306", "MariaDB")
	admin, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	prefix := testenv.UniqueName("mm")
	a, b := prefix+"_a", prefix+"_b"
	for _, db := range []string{a, b} {
		if _, err := admin.Exec("CREATE DATABASE `" + db + "`"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE IF EXISTS `" + db + "`") })
	}
	url := "mysql://root@127.0.0.1:3306/test"
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", a+".outbox,"+b+".outbox")
	if code != 0 || strings.Count(stdout, "applied migrations") != 2 {
		t.Fatalf("migrate --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := admin.Exec("INSERT INTO `"+b+"`.`outbox` (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', '1', 'T', '{}')", uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = runCLI(t, nil, "status", "--db", url, "--tables", prefix+"_*.outbox")
	unpublished := map[string]string{}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 1 {
			unpublished[f[0]] = f[1]
		}
	}
	if code != 0 || len(lines) != 3 || unpublished[a+".outbox"] != "0" || unpublished[b+".outbox"] != "1" {
		t.Fatalf("status --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = runCLI(t, nil, "dlq", "list", "--db", url, "--tables", prefix+"_*.outbox")
	if code != 0 || !strings.Contains(stdout, "no dead letters") {
		t.Fatalf("dlq list --tables: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestManyTablesSQLite: --tables on SQLite, whose tables all live in main: migrate
// creates the tables named (once each, named with or without main), status, dlq
// list and ui find them by pattern; relay --tables stays PostgreSQL's.
func TestManyTablesSQLite(t *testing.T) {
	url := "sqlite://" + filepath.Join(t.TempDir(), "tenants.db")
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", "tenant_1,main.tenant_2,main.tenant_1")
	if code != 0 || strings.Count(stdout, "applied migrations") != 2 {
		t.Fatalf("migrate --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	db, err := outboxsqlite.Open(strings.TrimPrefix(url, "sqlite://"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("INSERT INTO tenant_2 (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', '1', 'T', '{}')", uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = runCLI(t, nil, "status", "--db", url, "--tables", "tenant_*")
	unpublished := map[string]string{}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 1 {
			unpublished[f[0]] = f[1]
		}
	}
	if code != 0 || len(lines) != 3 || unpublished["main.tenant_1"] != "0" || unpublished["main.tenant_2"] != "1" {
		t.Fatalf("status --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = runCLI(t, nil, "dlq", "list", "--db", url, "--tables", "tenant_*")
	if code != 0 || !strings.Contains(stdout, "no dead letters") {
		t.Fatalf("dlq list --tables: exit %d\n%s%s", code, stdout, stderr)
	}
}
