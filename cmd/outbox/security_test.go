package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/internal/testenv"
)

// TestSecretsNeverPrinted: a table of bad inputs, each carrying a password or secret
// in a form the old redactor missed; no error line shows it.
func TestSecretsNeverPrinted(t *testing.T) {
	url := testenv.DatabaseURL(t)
	cfg := filepath.Join(t.TempDir(), "relay.properties")
	if err := os.WriteFile(cfg, []byte("webhook-secrets whsec_hunter2hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badLine := filepath.Join(t.TempDir(), "bad.properties")
	if err := os.WriteFile(badLine, []byte("=hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"unescaped slash in a URL password", []string{"status", "--db", "postgres://admin:hun/ter2@127.0.0.1:1/db"}},
		{"reserved characters in a URL password", []string{"status", "--db", "postgres://admin:a@b?c#hunter2@127.0.0.1:1/db"}},
		{"key/value DSN", []string{"status", "--db", "host=127.0.0.1 port=1 password=hunter2"}},
		{"MySQL driver DSN", []string{"status", "--db", "root:hunter2@tcp(127.0.0.1:1)/x"}},
		{"NATS URL that does not parse", []string{"relay", "--db", url, "--broker", "nats://u:hunter2@[::1"}},
		{"NATS password with a slash", []string{"relay", "--db", url, "--broker", "nats://u:hun/ter2@127.0.0.1:1"}},
		{"AMQP password", []string{"relay", "--db", url, "--broker", "amqp://u:hunter2@127.0.0.1:1/"}},
		{"config line with a space", []string{"relay", "--db", url, "--broker", "stdout:", "--config", cfg}},
		{"config line without a key", []string{"relay", "--db", url, "--broker", "stdout:", "--config", badLine}},
		{"a quote in a URL password", []string{"status", "--db", "postgres://u:hun'hunter2@127.0.0.1:1/x"}},
		{"a double quote in a URL password", []string{"status", "--db", `postgres://u:hun"hunter2@127.0.0.1:1/x`}},
		{"a space in a URL password", []string{"status", "--db", "postgres://u:hun hunter2@127.0.0.1:1/x"}},
		{"an unescaped @ in a URL password", []string{"status", "--db", "postgres://u:hun@hunter2@127.0.0.1:1/x"}},
		{"a URL without a scheme", []string{"status", "--db", "u:hunter2@127.0.0.1/x"}},
		{"a NATS token", []string{"relay", "--db", url, "--broker", "nats://hunter2@127.0.0.1:1"}},
		{"a webhook secret in the query", []string{"relay", "--db", url, "--broker", "http://192.0.2.1/x?api_key=hunter2&access_token=hunter2", "--webhook-secret", "whsec_aHVudGVyMg=="}},
		{"plain http to a remote webhook", []string{"relay", "--db", url, "--broker", "http://u:hunter2@192.0.2.1/x", "--webhook-secret", "whsec_aHVudGVyMg=="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, nil, tc.args...)
			if code == 0 {
				t.Fatalf("accepted: %s", stdout)
			}
			for _, secret := range []string{"hunter2", "ter2", "aHVudGVyMg"} {
				if strings.Contains(stdout+stderr, secret) {
					t.Fatalf("output shows the secret %q: %s", secret, stderr)
				}
			}
		})
	}
}

// TestSecretFiles: every flag can come from a file named by OUTBOX_<FLAG>_FILE (the
// container-secrets convention), and the webhook secret from --webhook-secret-file.
func TestSecretFiles(t *testing.T) {
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	dbFile := filepath.Join(t.TempDir(), "db")
	if err := os.WriteFile(dbFile, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runCLI(t, []string{"OUTBOX_DB_FILE=" + dbFile}, "migrate", "--table", schema+".outbox")
	if code != 0 || !strings.Contains(stdout, "applied migrations") {
		t.Fatalf("migrate with OUTBOX_DB_FILE: %d %s %s", code, stdout, stderr)
	}
	_, stderr, code = runCLI(t, []string{"OUTBOX_DB_FILE=/no/such/file"}, "status")
	if code != 2 || !strings.Contains(stderr, "OUTBOX_DB_FILE") {
		t.Fatalf("missing OUTBOX_DB_FILE: %d %s", code, stderr)
	}
	_, stderr, code = runCLI(t, nil, "relay", "--db", url, "--table", schema+".outbox", "--broker", "http://127.0.0.1:1/x",
		"--webhook-secret-file", "/no/such/secret")
	if code == 0 || !strings.Contains(stderr, "--webhook-secret-file") {
		t.Fatalf("missing --webhook-secret-file: %d %s", code, stderr)
	}
}

// TestDeadLettersPrintedSafely: control characters in an event's fields are shown
// escaped by `outbox dlq list`, never sent to the terminal raw.
func TestDeadLettersPrintedSafely(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	evil := "agg\x1b]0;pwned\x07\x1b[2K\rforged line\u202e"
	_, err := pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{table.Schema, "outbox_dead"}.Sanitize()+
		` (id, aggregatetype, aggregateid, type, payload, seq, created_at, attempts, error, holds_key)
VALUES ($1, 'order', $2, 'T', '{}', 1, now(), 1, $3, true)`, uuid.NewString(), evil, "refused: "+evil)
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runCLI(t, nil, "dlq", "list", "--db", url, "--table", table.Schema+".outbox")
	if code != 0 {
		t.Fatalf("dlq list: %d %s", code, stderr)
	}
	if strings.ContainsAny(stdout, "\x1b\x07\r") || strings.Contains(stdout, "\u202e") {
		t.Fatalf("control characters reached the terminal: %q", stdout)
	}
	if !strings.Contains(stdout, `agg\x1b]0;pwned\x07\x1b[2K\x0dforged line\u202e`) {
		t.Fatalf("the aggregate id is not shown escaped: %q", stdout)
	}
}

// TestLeastPrivilegeRelay: the relay runs as a role holding exactly the grants
// docs/security.md lists for it, and relays, dead-letters an event and cleans up, in
// each completion mode that keeps history (mark, archive).
func TestLeastPrivilegeRelay(t *testing.T) {
	for _, completion := range []string{"mark", "archive"} {
		t.Run(completion, func(t *testing.T) { leastPrivilegeRelay(t, completion) })
	}
}

func leastPrivilegeRelay(t *testing.T, completion string) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	redisURL := testenv.ServiceURL(t, "TEST_REDIS_URL", "redis://127.0.0.1:6379/0", "127.0.0.1:6379", "Redis")
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	schema := testenv.Schema(t, url)
	table := migrateSchema(t, url, schema, "outbox")
	roleURL := grantRole(t, pool, url, "relay-grants", "outbox_relay", schema)

	writeEvents(t, pool, table, 4, 40)
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "outbox"}.Sanitize()+
		` (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'too-big', 'T', $2)`,
		uuid.NewString(), `{"pad":"`+strings.Repeat("x", 2000)+`"}`); err != nil {
		t.Fatal(err)
	}
	prefix := testenv.UniqueName("leastpriv:")
	relayProc := startRelayProc(t, nil, "--db", roleURL, "--table", schema+".outbox", "--broker", redisURL, "--completion", completion,
		"--topic-template", prefix+"${aggregatetype}", "--max-message-bytes", "1000", "--poll-interval", "50ms", "--http", "")
	ctx30, cancel30 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel30()
	q := "SELECT count(*) FROM " + pgx.Identifier{schema, "outbox"}.Sanitize() + " WHERE published_at IS NULL"
	testenv.WaitTell(t, ctx30, "every event published by the relay role", func() bool {
		var n int64
		return pool.QueryRow(ctx, q).Scan(&n) == nil && n == 0
	}, relayProc.output)
	var dead, archived int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+pgx.Identifier{schema, "outbox_dead"}.Sanitize()+`),
       (SELECT count(*) FROM `+pgx.Identifier{schema, "outbox_published"}.Sanitize()+`)`).Scan(&dead, &archived); err != nil {
		t.Fatal(err)
	}
	if dead != 1 {
		t.Fatalf("%d dead letters, want the oversized event:\n%s", dead, relayProc.output())
	}
	if want := map[string]int{"mark": 0, "archive": 40}[completion]; archived != want {
		t.Fatalf("%d rows archived, want %d", archived, want)
	}
	stdout, stderr, code := runCLI(t, nil, "cleanup", "--db", roleURL, "--table", schema+".outbox", "--older-than", "1ns")
	if code != 0 {
		t.Fatalf("cleanup as the relay role: %d %s %s", code, stdout, stderr)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+pgx.Identifier{schema, "outbox"}.Sanitize()+`)
       + (SELECT count(*) FROM `+pgx.Identifier{schema, "outbox_published"}.Sanitize()+`)`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d published rows left after cleanup", left)
	}
	if out := relayProc.output(); strings.Contains(out, "permission denied") {
		t.Fatalf("the relay met a missing grant:\n%s", out)
	}
	// The documented operator role reads the status while another role's relay holds
	// the lock (pg_stat_activity hides that session's details from it).
	operatorURL := grantRole(t, pool, url, "operator-grants", "outbox_operator", schema)
	stdout, stderr, code = runCLI(t, nil, "status", "--db", operatorURL, "--table", schema+".outbox")
	if code != 0 || !strings.Contains(stdout, "active relay:          pid ") {
		t.Fatalf("status as the operator role while a relay runs: exit %d\n%s%s", code, stdout, stderr)
	}
	// The operator's dead-letter work: list, show, edit, replay, with exactly its grants.
	var deadID string
	if err := pool.QueryRow(ctx, `SELECT id::text FROM `+pgx.Identifier{schema, "outbox_dead"}.Sanitize()).Scan(&deadID); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"dlq", "list"}, {"dlq", "show", deadID}, {"dlq", "edit", deadID, "--payload", `{"small":true}`}, {"dlq", "replay", deadID},
		{"retry", "--all"}, {"replay", "--dry-run"},
	} {
		stdout, stderr, code := runCLI(t, nil, append(args, "--db", operatorURL, "--table", schema+".outbox")...)
		if code != 0 {
			t.Fatalf("%v as the operator role: exit %d\n%s%s", args, code, stdout, stderr)
		}
	}
}

// grantRole creates a role of its own from the SQL block that follows <!-- marker -->
// in docs/security.md (docRole renamed, schema app replaced by schema), drops it when
// the test ends, and returns url logged in as it.
func grantRole(t *testing.T, pool *pgxpool.Pool, url, marker, docRole, schema string) string {
	t.Helper()
	role := strings.ToLower(testenv.UniqueName(docRole + "_"))
	block := docSQL(t, marker)
	sql := strings.NewReplacer("CREATE ROLE "+docRole+" ", "CREATE ROLE "+role+" ", "TO "+docRole+";", "TO "+role+";",
		"SCHEMA app ", "SCHEMA "+pgx.Identifier{schema}.Sanitize()+" ", "app.", pgx.Identifier{schema}.Sanitize()+".").Replace(block)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	for _, stmt := range strings.Split(sql, ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			if _, err := pool.Exec(context.Background(), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User(role)
	return u.String()
}

// TestLeastPrivilegeCDCRelay: the CDC relay runs as a role with REPLICATION and the
// grants docs/security.md lists, nothing more (the publication and slot were made by
// the owner's `migrate --cdc`), and relays every event in order.
func TestLeastPrivilegeCDCRelay(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table, _ := cdcTable(t, url, pool)
	roleURL := grantRole(t, pool, url, "cdc-grants", "outbox_cdc", table.Schema)
	ns := newNATSScope(t)
	const n = 300
	want := writeEvents(t, pool, table, 5, n)
	p := startRelayProc(t, nil, "--db", roleURL, "--table", table.Schema+".outbox", "--broker", ns.url, "--mode", "cdc",
		"--topic-template", ns.template(), "--http", "")
	checkOrder(t, want, ns.read(t, n))
	if out := p.output(); strings.Contains(out, "permission denied") {
		t.Fatalf("the CDC relay met a missing grant:\n%s", out)
	}
}

// TestDashboardOffTheMetricsPort: a relay whose --http leaves loopback (so Prometheus
// can scrape it) serves /metrics but not the dashboard, unless it has an admin
// token; and its HTTP server does not keep an idle or a trickling client forever.
func TestDashboardOffTheMetricsPort(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	port := testenv.FreePort(t)
	p := startRelayProc(t, nil, "--db", url, "--table", table.Schema+"."+table.Name, "--broker", "stdout:",
		"--http", fmt.Sprintf("0.0.0.0:%d", port))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	testenv.WaitTell(t, context.Background(), "/metrics served", func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, p.output)
	resp, err := http.Get(base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(p.output(), "the dashboard is off") {
		t.Fatalf("/ui/ on a non-loopback --http without a token: %d\n%s", resp.StatusCode, p.output())
	}
	// A client that sends half a request is cut off (ReadHeaderTimeout), not kept.
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("a half-sent request was not closed by the server: %v", err)
	}
}

// TestTerminalSafeOutput: dead letters whose fields hold a right-to-left override, C1
// controls, DEL and a line separator print escaped in `dlq list`, `dlq list --json`
// and `dlq show` (the JSON still decodes to the same values), and a 100 KB aggregate
// id does not pad every row of the list.
func TestTerminalSafeOutput(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	tbl := pgx.Identifier{table.Schema, table.Name + "_dead"}.Sanitize()
	hostile := "evil\u202egnp.exe\u009b\u0085\x7f\u2028x"
	for _, agg := range []string{hostile, strings.Repeat("a", 100_000), "short"} {
		if _, err := pool.Exec(context.Background(), `INSERT INTO `+tbl+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, attempts, error, holds_key)
VALUES ($1, 'order', $2, $3, '{}', nextval(pg_get_serial_sequence($4, 'seq')), now(), 1, $3, false)`,
			uuid.NewString(), agg, hostile, table.Schema+"."+table.Name); err != nil {
			t.Fatal(err)
		}
	}
	name := table.Schema + "." + table.Name
	raw := "\u202e\u009b\u0085\x7f\u2028"
	text, stderr, code := runCLI(t, nil, "dlq", "list", "--db", url, "--table", name)
	if code != 0 || strings.ContainsAny(text, raw) || !strings.Contains(text, `evil\u202egnp.exe`) {
		t.Fatalf("dlq list: %d %s\n%q", code, stderr, text)
	}
	for _, line := range strings.Split(text, "\n") {
		if len(line) > 400 {
			t.Fatalf("a list line of %d bytes: one long aggregate id pads the rows", len(line))
		}
	}
	js, _, code := runCLI(t, nil, "dlq", "list", "--json", "--db", url, "--table", name)
	var dead []struct {
		AggregateID string `json:"aggregateid"`
	}
	if code != 0 || strings.ContainsAny(js, raw) || json.Unmarshal([]byte(js), &dead) != nil || len(dead) != 3 || dead[0].AggregateID != hostile {
		t.Fatalf("dlq list --json: %d, the raw runes printed or the values changed:\n%.400q", code, js)
	}
}

// TestBigPayloadPreviews: a dead letter with a 20 MB payload is listed and shown as a
// preview with its size (the database cuts it), and whole only when asked.
func TestBigPayloadPreviews(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	id := uuid.NewString()
	big := `{"pad":"` + strings.Repeat("x", 20<<20) + `"}`
	if _, err := pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{table.Schema, table.Name + "_dead"}.Sanitize()+
		` (id, aggregatetype, aggregateid, type, payload, seq, created_at, attempts, error, holds_key) VALUES ($1, 'order', 'a', 'T', $2, 1, now(), 1, 'too large', false)`,
		id, big); err != nil {
		t.Fatal(err)
	}
	name := table.Schema + "." + table.Name
	for _, args := range [][]string{{"dlq", "list", "--json"}, {"dlq", "show", id}} {
		out, stderr, code := runCLI(t, nil, append(args, "--db", url, "--table", name)...)
		if code != 0 || len(out) > 200<<10 || !strings.Contains(out, `"payload_size": `) {
			t.Fatalf("%v: exit %d, %d bytes out (want a preview and the size)\n%.300s%s", args, code, len(out), out, stderr)
		}
	}
	out, _, code := runCLI(t, nil, "dlq", "show", id, "--full-payload", "--db", url, "--table", name)
	if code != 0 || len(out) < 20<<20 {
		t.Fatalf("dlq show --full-payload: exit %d, %d bytes", code, len(out))
	}
}

// docSQL is the SQL block that follows <!-- marker --> in docs/security.md.
func docSQL(t *testing.T, marker string) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(doc), "<!-- "+marker+" -->\n```sql\n")
	block, _, _ = strings.Cut(block, "```")
	if !strings.Contains(block, "GRANT") {
		t.Fatalf("docs/security.md has no %s block", marker)
	}
	return block
}

// TestWriterCannotTakeTheRelaysLock: with the advisory-lock functions taken from
// PUBLIC as docs/security.md shows (in a database of the test's own: it changes the
// database's function privileges), a writer role's session cannot take the relay's
// lock, and the relay role, given them back, relays as before.
func TestWriterCannotTakeTheRelaysLock(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	admin := testenv.Pool(t, url)
	dbName := strings.ToLower(testenv.UniqueName("outbox_locks_"))
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)") })
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + dbName
	dbURL := u.String()
	pool := testenv.Pool(t, dbURL)
	table := migrateSchema(t, dbURL, "public", "outbox")
	relayURL := grantRole(t, pool, dbURL, "relay-grants", "outbox_relay", "public")
	writerURL := grantRole(t, pool, dbURL, "writer-grants", "outbox_writer", "public")
	relayRole, _ := neturl.Parse(relayURL)
	for _, stmt := range strings.Split(strings.ReplaceAll(docSQL(t, "advisory-grants"), "TO outbox_relay;", "TO "+relayRole.User.Username()+";"), ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	writer := testenv.Pool(t, writerURL)
	if _, err := writer.Exec(ctx, "SELECT pg_advisory_lock(42)"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("the writer took an advisory lock: %v", err)
	}
	if _, err := writer.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', '1', 'T', '{}')"); err != nil {
		t.Fatalf("the writer cannot write: %v", err)
	}
	p := startRelayProc(t, nil, "--db", relayURL, "--broker", "stdout:", "--http", "")
	waitUnpublished(t, pool, table, 0, 30*time.Second)
	if strings.Contains(p.output(), "permission denied") {
		t.Fatalf("the relay met a missing grant:\n%s", p.output())
	}
}

// TestBrokerTokenNeverPrinted: a broker URL whose user info is a lone token
// (nats://TOKEN@host) is a credential like a password: none of relay (which waits
// for an unreachable broker), verify and replay prints it when the broker does not
// answer, on a migrated table, so the broker is really dialed.
func TestBrokerTokenNeverPrinted(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	name := table.Schema + "." + table.Name
	const token = "s3cr3tt0ken"
	broker := fmt.Sprintf("nats://%s@127.0.0.1:%d", token, testenv.FreePort(t))
	p := startRelayProc(t, nil, "--db", url, "--table", name, "--broker", broker)
	testenv.WaitTell(t, context.Background(), "the relay to say the broker does not answer", func() bool {
		return strings.Contains(p.output(), "the broker does not answer")
	}, p.output)
	if strings.Contains(p.output(), token) {
		t.Fatalf("relay output shows the token:\n%s", p.output())
	}
	for _, args := range [][]string{
		{"verify", "--db", url, "--table", name, "--broker", broker},
		{"replay", "--db", url, "--table", name, "--broker", broker, "--since", "1h"},
	} {
		stdout, stderr, code := runCLI(t, nil, args...)
		if code == 0 || strings.Contains(stdout+stderr, token) {
			t.Fatalf("%s: exit %d, want a failure without the token:\n%s%s", args[0], code, stdout, stderr)
		}
	}
}

// TestTablesOwnedByOthers: a role with nothing but CREATE on the database makes its
// own outbox in a schema --tables matches, with triggers that would run, as whoever
// touches the table, code that writes who ran it. `migrate --tables`, `status
// --tables` and `relay --tables`, run as the admin, refuse that table with its reason
// and never touch it, and act on the others; trusting its owner (--trust-owner) still
// refuses it for its triggers.
func TestTablesOwnedByOthers(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	prefix := strings.ToLower(testenv.UniqueName("tenant_"))
	tenant := prefix + "_role"
	evil, good := prefix+"_evil", prefix+"_good"
	witness := pgx.Identifier{testenv.Schema(t, url), "witness"}.Sanitize()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+evil+" CASCADE")
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+tenant)
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+tenant)
	})
	exec("CREATE ROLE " + tenant + " LOGIN")
	var db string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	exec("GRANT CREATE ON DATABASE " + pgx.Identifier{db}.Sanitize() + " TO " + tenant)
	exec("CREATE TABLE " + witness + " (who text)")
	exec("GRANT USAGE ON SCHEMA " + strings.Split(witness, ".")[0] + " TO PUBLIC")
	exec("GRANT INSERT ON " + witness + " TO PUBLIC")

	// The tenant makes its outbox with the documented command, as itself, then arms it.
	tenantURL, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	tenantURL.User = neturl.User(tenant)
	tenantPool := testenv.Pool(t, tenantURL.String())
	if _, err := tenantPool.Exec(ctx, "CREATE SCHEMA "+evil); err != nil {
		t.Fatal(err)
	}
	migrateSchema(t, tenantURL.String(), evil, "outbox")
	for _, stmt := range []string{
		`CREATE FUNCTION ` + evil + `.run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO ` + witness + ` VALUES (current_user); RETURN NULL; END $$`,
		"CREATE TRIGGER t AFTER INSERT OR UPDATE OR DELETE ON " + evil + ".outbox_migrations FOR EACH STATEMENT EXECUTE FUNCTION " + evil + ".run()",
		"CREATE TRIGGER t AFTER UPDATE OR DELETE ON " + evil + ".outbox FOR EACH STATEMENT EXECUTE FUNCTION " + evil + ".run()",
		"INSERT INTO " + evil + ".outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'x', 'T', '{}')",
	} {
		if _, err := tenantPool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	exec("CREATE SCHEMA " + good)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+good+" CASCADE") })
	goodTable := migrateSchema(t, url, good, "outbox")
	pattern := prefix + "_*.outbox"
	ran := func() string {
		t.Helper()
		var who []string
		rows, err := pool.Query(ctx, "SELECT who FROM "+witness)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var w string
			_ = rows.Scan(&w)
			who = append(who, w)
		}
		return strings.Join(who, ", ")
	}

	// migrate: the admin's documented upgrade of every tenant.
	stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", pattern)
	out := stdout + stderr
	if code == 0 || !strings.Contains(out, "refusing table "+evil+".outbox") || !strings.Contains(out, "owned by role "+tenant) {
		t.Fatalf("migrate --tables: exit %d, want a refusal naming %s.outbox and its owner:\n%s", code, evil, out)
	}
	if who := ran(); who != "" {
		t.Fatalf("the tenant's trigger ran as %s during migrate", who)
	}
	// Trusting the owner is not enough: the triggers are code outbox did not create.
	stdout, stderr, code = runCLI(t, nil, "migrate", "--db", url, "--tables", pattern, "--trust-owner", tenant)
	if out := stdout + stderr; code == 0 || !strings.Contains(out, "trigger t on outbox_migrations") {
		t.Fatalf("migrate --tables --trust-owner: exit %d, want a refusal for the trigger:\n%s", code, out)
	}
	stdout, stderr, code = runCLI(t, nil, "status", "--db", url, "--tables", pattern)
	if code != 0 || strings.Contains(stdout, evil) || !strings.Contains(stdout, good) || !strings.Contains(stderr, "refusing table "+evil+".outbox") {
		t.Fatalf("status --tables: exit %d, want %s listed and %s refused:\n%s%s", code, good, evil, stdout, stderr)
	}

	// relay: it relays the good table and leaves the tenant's alone.
	ns := newNATSScope(t)
	want := writeEvents(t, pool, goodTable, 2, 20)
	p := startRelayProc(t, nil, "--db", url, "--tables", pattern, "--broker", ns.url, "--topic-template", ns.template())
	checkOrder(t, want, ns.read(t, 20))
	ctx10, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	testenv.WaitTell(t, ctx10, "the refusal logged", func() bool {
		return strings.Contains(p.output(), "refusing a table owned by others")
	}, p.output)
	if who := ran(); who != "" {
		t.Fatalf("the tenant's trigger ran as %s during the relay:\n%s", who, p.output())
	}
}

// TestSecretFilePermissions: an OUTBOX_*_FILE secret that every user of the host may read is
// used with a warning (as ssh warns of a key), one readable by its owner (or group)
// only is used quietly, and a file too big to be a secret is refused, whole, with
// nothing of it printed.
func TestSecretFilePermissions(t *testing.T) {
	url := testenv.DatabaseURL(t)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	dir := t.TempDir()
	secret := func(name string, mode os.FileMode, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		return path
	}
	for _, c := range []struct {
		name string
		mode os.FileMode
		warn bool
	}{{"world-readable", 0o644, true}, {"owner-only", 0o600, false}, {"group", 0o440, false}} {
		t.Run(c.name, func(t *testing.T) {
			path := secret(c.name, c.mode, url)
			_, stderr, code := runCLI(t, []string{"OUTBOX_DB_FILE=" + path}, "status", "--table", table.String())
			if code != 0 {
				t.Fatalf("status with OUTBOX_DB_FILE (%04o): exit %d\n%s", c.mode, code, stderr)
			}
			if warned := strings.Contains(stderr, "readable by every user"); warned != c.warn {
				t.Fatalf("mode %04o: warned %v, want %v:\n%s", c.mode, warned, c.warn, stderr)
			}
		})
	}
	t.Run("too big", func(t *testing.T) {
		path := secret("big", 0o600, "postgres://u:hunter2@db/"+strings.Repeat("x", 70<<10))
		_, stderr, code := runCLI(t, []string{"OUTBOX_DB_FILE=" + path}, "status", "--table", table.String())
		if code == 0 || !strings.Contains(stderr, "holds more than 64 KiB") || strings.Contains(stderr, "hunter2") {
			t.Fatalf("a 70 KiB secret file: exit %d, want a refusal that prints none of it:\n%s", code, stderr)
		}
	})
}
