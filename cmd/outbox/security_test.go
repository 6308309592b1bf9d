package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

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
