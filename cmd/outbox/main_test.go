package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

var binary string // the outbox command, built once for the process tests

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-cli")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "outbox")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		panic(fmt.Sprintf("build: %v\n%s", err, out))
	}
	code := 0
	// The Pub/Sub client's OpenCensus dependency starts a worker at init, for good;
	// its subscriber's stream keep-alive ends on its next tick after Receive returned.
	ignore := []goleak.Option{goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("cloud.google.com/go/pubsub/v2.(*messageIterator).streamKeepAliveHandler")}
	func() {
		defer os.RemoveAll(dir)
		if err := goleak.Find(ignore...); err != nil {
			panic(err)
		}
		code = m.Run()
		if err := goleak.Find(ignore...); err != nil && code == 0 {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}()
	os.Exit(code)
}

func runCLI(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = run(ctx, args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestHelpCommand: `outbox help CMD` prints that command's flags (and a subcommand's),
// not the top-level help.
func TestHelpCommand(t *testing.T) {
	for _, args := range [][]string{{"help", "relay"}, {"help", "dlq", "replay"}, {"relay", "-h"}} {
		_, stderr, code := runCLI(t, nil, args...)
		want := "Usage of outbox " + strings.Join(args[1:], " ")
		if args[0] != "help" {
			want = "Usage of outbox relay"
		}
		if code != 0 || !strings.Contains(stderr, want) || strings.Contains(stderr, "Commands:") {
			t.Errorf("outbox %s: exit %d, want its own flags (%q):\n%s", strings.Join(args, " "), code, want, stderr)
		}
	}
	// Each dlq subcommand lists its own flags, and `help dlq` the subcommands.
	for sub, flags := range map[string][2]string{"list": {"-json", "-payload"}, "edit": {"-payload-file", "-older-than"},
		"show": {"-full-payload", "-all"}, "purge": {"-all", "-header"}} {
		_, stderr, _ := runCLI(t, nil, "help", "dlq", sub)
		lists := func(flag string) bool { return regexp.MustCompile(`(?m)^  ` + flag + `\b[^-]`).MatchString(stderr) }
		if !lists(flags[0]) || lists(flags[1]) {
			t.Errorf("outbox help dlq %s: want %s and not %s:\n%s", sub, flags[0], flags[1], stderr)
		}
	}
	if _, stderr, code := runCLI(t, nil, "help", "dlq"); code != 0 || !strings.Contains(stderr, "replay   put dead letters back") {
		t.Errorf("outbox help dlq: exit %d:\n%s", code, stderr)
	}
}

// TestVersion: `outbox version` and `outbox --version` say the module version, the
// VCS revision and the Go version, in one line.
func TestVersion(t *testing.T) {
	re := regexp.MustCompile(`^outbox \S+ \(revision \S+, go1\.\d+\S* \w+/\w+\)\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		stdout, stderr, code := runCLI(t, nil, args...)
		if code != 0 || !re.MatchString(stdout) {
			t.Errorf("outbox %s: exit %d, stdout %q, stderr %q", args[0], code, stdout, stderr)
		}
	}
}

func TestBadInputGetsOneClearLine(t *testing.T) {
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	migrateSchema(t, url, schema, "outbox")
	natsURL := natstest.URL(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no command", nil, 2, "Usage"},
		{"unknown command", []string{"launch"}, 2, "unknown command"},
		{"migrate --print --cdc", []string{"migrate", "--print", "--cdc", "--slot", "BAD-slot!"}, 2, "--print cannot show --cdc's setup"},
		{"bad slot name", []string{"migrate", "--db", url, "--cdc", "--slot", "BAD-slot!"}, 2, "a replication slot name is"},
		{"slot without cdc", []string{"migrate", "--db", url, "--slot", "s"}, 2, "--slot and --publication go with --cdc"},
		{"cdc and drop-cdc", []string{"migrate", "--db", url, "--cdc", "--drop-cdc"}, 2, "give one of them"},
		{"drop-cdc printed", []string{"migrate", "--db", url, "--drop-cdc", "--print"}, 2, "--drop-cdc drops a slot"},
		{"drop-cdc on SQLite", []string{"migrate", "--db", "sqlite://" + filepath.Join(t.TempDir(), "x.db"), "--drop-cdc"}, 2, "--drop-cdc needs PostgreSQL"},
		{"short ui token", []string{"relay", "--db", url, "--broker", "stdout:", "--ui-token", "abc"}, 2, "--ui-token: 3 characters, want at least 16"},
		{"no db", []string{"relay", "--broker", "nats://127.0.0.1:4222"}, 2, "--db is required"},
		{"bad scheme", []string{"status", "--db", "oracle://x"}, 2, "unknown scheme"},
		{"not a url", []string{"status", "--db", "host=foo"}, 2, "want a URL"},
		{"unreachable db", []string{"status", "--db", "postgres://u:hunter2@127.0.0.1:1/x"}, 1, "cannot reach the database"},
		{"injection in table", []string{"status", "--db", url, "--table", "outbox; DROP TABLE canary;--"}, 2, "invalid identifier"},
		{"quoted table", []string{"status", "--db", url, "--table", `"Outbox"`}, 2, "invalid identifier"},
		{"missing table", []string{"status", "--db", url, "--table", "public.no_such_outbox"}, 1, "does not exist (run `outbox migrate`)"},
		{"bad payload type", []string{"migrate", "--print", "--payload-type", "xml"}, 2, "--payload-type"},
		{"no broker", []string{"relay", "--db", url}, 2, "--broker is required"},
		{"unknown broker", []string{"relay", "--db", url, "--broker", "pulsar://127.0.0.1:6650"}, 2, "unknown scheme"},
		{"webhook without secret", []string{"relay", "--db", url, "--broker", "https://hooks.example.invalid/x"}, 2, "--webhook-secret"},
		{"bad batch", []string{"relay", "--db", url, "--broker", "nats://127.0.0.1:1", "--batch-size", "-5"}, 2, "--batch-size -5: want at least 1"},
		// 0 on the command line is off where a thing can be off, else refused; never a default.
		{"zero batch", []string{"relay", "--db", url, "--broker", "stdout:", "--batch-size", "0"}, 2, "--batch-size 0: want at least 1"},
		{"zero poll", []string{"relay", "--db", url, "--broker", "stdout:", "--poll-interval", "0"}, 2, "--poll-interval 0s: want a duration above 0"},
		{"zero message bytes", []string{"relay", "--db", url, "--broker", "stdout:", "--max-message-bytes", "0"}, 2, "leave it out for the publisher's own limit"},
		{"zero max conns", []string{"relay", "--db", url, "--broker", "stdout:", "--tables", "*.outbox", "--max-conns", "0"}, 2, "--max-conns 0: want at least 3"},
		{"bad template", []string{"relay", "--db", url, "--broker", "nats://127.0.0.1:1", "--topic-template", "a.${who}"}, 2, "unknown placeholder"},
		{"group in cdc mode", []string{"relay", "--db", url, "--mode", "cdc", "--group", "--broker", "stdout:"}, 2, "--group needs PostgreSQL in poll mode"},
		{"short partition lease", []string{"relay", "--db", url, "--group", "--partition-lease", "100ms", "--broker", "stdout:"}, 2, "LeaseTTL"},
		{"too many partitions", []string{"migrate", "--print", "--partitions", "5000"}, 2, "--partitions"},
		{"zero partitions", []string{"migrate", "--print", "--partitions", "0"}, 2, "--partitions"},
		{"unknown mode", []string{"relay", "--db", url, "--mode", "wal", "--broker", "stdout:"}, 2, "want poll or cdc"},
		{"replay: bad since", []string{"replay", "--db", url, "--since", "yesterday", "--broker", "stdout:"}, 2, "--since: \"yesterday\": want RFC 3339"},
		{"replay: not postgres", []string{"replay", "--db", "sqlite://" + t.TempDir() + "/x.db", "--broker", "stdout:"}, 2, "want postgres://"},
		{"replay: no history", []string{"replay", "--db", url, "--table", schema + ".outbox", "--broker", "stdout:"}, 2, "no published events are kept"},
		{"unknown format", []string{"relay", "--db", url, "--format", "avro", "--broker", "stdout:"}, 2, "want outbox or cloudevents"},
		{"cloudevents binary on redis", []string{"relay", "--db", url, "--format", "cloudevents", "--broker", "redis://127.0.0.1:6379"}, 2, "use structured mode"},
		{"cloudevents bad mode", []string{"relay", "--db", url, "--format", "cloudevents", "--cloudevents-mode", "batch", "--broker", "stdout:"}, 2, "want binary or structured"},
		{"cdc on sqlite", []string{"relay", "--db", "sqlite://" + t.TempDir() + "/x.db", "--mode", "cdc", "--broker", "stdout:"}, 2, "--mode cdc needs PostgreSQL"},
		{"bad slot name", []string{"relay", "--db", url, "--table", schema + ".outbox", "--mode", "cdc", "--slot", "Bad-Slot", "--broker", "stdout:"}, 2, "slot and publication names"},
		{"extra args", []string{"status", "now"}, 2, "unexpected arguments"},
		{"sqs url with a path", []string{"relay", "--db", url, "--table", schema + ".outbox", "--broker", "sqs://us-east-1/orders", "--http", ""}, 1, "want sqs://REGION"},
		{"sqs bad endpoint", []string{"relay", "--db", url, "--table", schema + ".outbox", "--broker", "sqs://us-east-1?endpoint=ftp://x", "--http", ""}, 1, "endpoint"},
		{"ui: metrics not a URL", []string{"ui", "--db", url, "--metrics", "relay:9464"}, 2, "--metrics"},
		{"ui: missing table", []string{"ui", "--db", url, "--table", "public.no_such_outbox"}, 1, "does not exist (run `outbox migrate`)"},
		{"ui: port taken", []string{"ui", "--db", url, "--table", schema + ".outbox", "--listen", "127.0.0.1:5432"}, 2, "cannot listen"},
		// Flags accepted in silence before: each is refused before anything connects
		// (the database is unreachable, and the error is the flag's).
		{"empty table", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--table", ""}, 2, "empty table or schema name"},
		{"table with an empty name", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--table", "public."}, 2, "empty table or schema name"},
		{"table of a dot", []string{"status", "--db", "postgres://u@127.0.0.1:1/x", "--table", "."}, 2, "empty table or schema name"},
		{"nanosecond poll", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--poll-interval", "1ns"}, 2, "PollInterval must be at least"},
		{"endless leader timeout", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--leader-timeout", "100000h"}, 2, "LeaderTimeout must be 400ms to 24h"},
		{"negative retention", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--retention", "-1h"}, 2, "--retention"},
		{"ui off loopback without a token", []string{"ui", "--db", "postgres://u@127.0.0.1:1/x", "--listen", "0.0.0.0:0"}, 2, "is not loopback and there is no --ui-token"},
		{"zero attempts", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--max-attempts", "0"}, 2, "--max-attempts 0: want at least 1"},
		{"negative batch bytes", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--max-batch-bytes", "-5"}, 2, "--max-batch-bytes"},
		{"negative redis maxlen", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--redis-maxlen", "-1"}, 2, "--redis-maxlen"},
		{"negative message bytes", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--max-message-bytes", "-1"}, 2, "--max-message-bytes"},
		{"bad duration", []string{"relay", "--poll-interval", "5x"}, 2, "invalid value \"5x\" for flag -poll-interval: parse error (`outbox help relay` lists the flags)"},
		{"unknown flag", []string{"dlq", "replay", "--nope"}, 2, "flag provided but not defined: -nope (`outbox help dlq replay` lists the flags)"},
		{"unknown kafka compression", []string{"relay", "--db", "postgres://u@127.0.0.1:1/x", "--broker", "kafka://127.0.0.1:1", "--kafka-compression", "brotli"}, 2, "--kafka-compression"},
		{"template the broker refuses", []string{"relay", "--db", url, "--table", schema + ".outbox", "--broker", natsURL, "--http", "",
			"--topic-template", "outbox event.${aggregatetype}"}, 1, "holds white space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runCLI(t, nil, tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.code, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not say %q", stderr, tc.want)
			}
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("stderr leaks the password: %s", stderr)
			}
			if tc.code != 2 || tc.want != "Usage" {
				if lines := strings.Count(strings.TrimSpace(stderr), "\n"); lines > 0 && !strings.Contains(stderr, "Usage") {
					t.Errorf("error spans %d lines: %s", lines+1, stderr)
				}
			}
		})
	}
}

func TestEnvironmentVariables(t *testing.T) {
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	stdout, stderr, code := runCLI(t, []string{"OUTBOX_DB=" + url, "OUTBOX_TABLE=" + schema + ".events"}, "migrate")
	if code != 0 || !strings.Contains(stdout, "applied migrations [1 2 3 4 5 6 7 8 9 10 11]") {
		t.Fatalf("migrate via env: code %d, %s %s", code, stdout, stderr)
	}
	stdout, _, code = runCLI(t, []string{"OUTBOX_DB=" + url, "OUTBOX_TABLE=" + schema + ".events"}, "migrate")
	if code != 0 || !strings.Contains(stdout, "up to date") {
		t.Fatalf("second migrate: code %d, %s", code, stdout)
	}
	stdout, _, code = runCLI(t, []string{"OUTBOX_DB=" + url}, "status", "--table", schema+".events", "--json")
	if code != 0 || !strings.Contains(stdout, `"unpublished": 0`) {
		t.Fatalf("status --json: code %d, %s", code, stdout)
	}
	_, stderr, code = runCLI(t, []string{"OUTBOX_BATCH_SIZE=many"}, "relay")
	if code != 2 || !strings.Contains(stderr, "OUTBOX_BATCH_SIZE") {
		t.Fatalf("bad env value: code %d, %s", code, stderr)
	}
}

func TestMigratePrint(t *testing.T) {
	stdout, _, code := runCLI(t, nil, "migrate", "--print", "--table", "app.events", "--payload-type", "bytes")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "app"."events"`, "payload            bytea", "COMMIT;"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--print output lacks %q:\n%s", want, stdout)
		}
	}
}

// migrateSchema creates an outbox table in schema.name.
func migrateSchema(t *testing.T, url, schema, name string) outboxdriver.Table {
	t.Helper()
	table := outboxdriver.Table{Schema: schema, Name: name}
	_, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", schema+"."+name)
	if code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	return table
}

// proc is a relay process.
type proc struct {
	cmd  *exec.Cmd
	out  *lockedWriter
	done chan struct{}
}

// killedByFailpoint waits for the relay to be killed by its OUTBOX_FAILPOINT, and
// checks it died of SIGKILL.
func (p *proc) killedByFailpoint(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the failpoint never killed the relay")
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("first relay ended with %v, want SIGKILL:\n%s", p.cmd.ProcessState, p.output())
	}
}

func (p *proc) output() string {
	p.out.mu.Lock()
	defer p.out.mu.Unlock()
	return p.out.w.String()
}

func startRelayProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	// No HTTP endpoints unless a test asks (parallel relays would fight over the port).
	cmd := exec.Command(binary, append([]string{"relay", "--log-level", "debug", "--http="}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{cmd: cmd, out: &lockedWriter{w: &bytes.Buffer{}}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("relay %d output:\n%s", cmd.Process.Pid, p.output())
		}
	})
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// natsScope is a stream and subject prefix of the test's own on the machine's NATS,
// and a core subscription that sees every publish, duplicates included.
type natsScope struct {
	url, stream, prefix string
	mu                  sync.Mutex
	raw                 map[string]int // publishes per event id
}

func newNATSScope(t *testing.T) *natsScope {
	t.Helper()
	url := natstest.URL(t)
	s := &natsScope{url: url, prefix: testenv.UniqueName("clitest"), raw: map[string]int{}}
	s.stream = s.prefix
	js, _ := natstest.CreateStream(t, url, jetstream.StreamConfig{Name: s.stream, Subjects: []string{s.prefix + ".>"}})
	if _, err := js.Conn().Subscribe(s.prefix+".>", func(m *natsgo.Msg) {
		s.mu.Lock()
		s.raw[m.Header.Get("Nats-Msg-Id")]++
		s.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *natsScope) template() string { return s.prefix + ".${aggregatetype}" }

func (s *natsScope) duplicates() (dups, distinct int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.raw {
		dups += n - 1
	}
	return dups, len(s.raw)
}

func (s *natsScope) read(t *testing.T, n int) []broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs, err := natstest.Read(ctx, s.url, s.stream, ">", n)
	if err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return msgs
}

// writeEvents writes n events over aggs aggregates, in transactions of 10, and
// returns the ids per aggregate in write order.
func writeEvents(t *testing.T, pool *pgxpool.Pool, table outboxdriver.Table, aggs, n int) map[string][]string {
	t.Helper()
	w, err := outbox.NewWriter(outboxpgx.New(pool, &table), &outbox.Config{NotifyInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := map[string][]string{}
	for i := 0; i < n; i += 10 {
		evs := make([]outbox.Event, 0, 10)
		for j := i; j < i+10 && j < n; j++ {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("agg-%d", j%aggs), Type: "Step",
				Payload: []byte(fmt.Sprintf(`{"seq":%d,"pad":"%s"}`, j, strings.Repeat("x", 150)))})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			want[ev.AggregateID] = append(want[ev.AggregateID], ev.ID)
		}
	}
	return want
}

// checkOrder asserts every id arrived once in the stream and in order per aggregate.
func checkOrder(t *testing.T, want map[string][]string, got []broker.Message) {
	t.Helper()
	pos := map[string]int{}
	total := 0
	for _, ids := range want {
		for i, id := range ids {
			pos[id] = i
		}
		total += len(ids)
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range got {
		i, ok := pos[m.ID]
		if !ok {
			t.Fatalf("unknown event %s in the stream", m.ID)
		}
		if seen[m.ID] {
			t.Fatalf("event %s stored twice (dedup failed)", m.ID)
		}
		seen[m.ID] = true
		if p, ok := last[m.Key]; ok && i < p {
			t.Fatalf("aggregate %s: event %d after %d", m.Key, i, p)
		}
		last[m.Key] = i
	}
	if len(seen) != total {
		t.Fatalf("stream has %d distinct events, want %d", len(seen), total)
	}
}

func waitUnpublished(t *testing.T, pool *pgxpool.Pool, table outboxdriver.Table, want int64, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	q := "SELECT count(*) FROM " + pgx.Identifier{table.Schema, table.Name}.Sanitize() + " WHERE published_at IS NULL"
	var n int64
	testenv.WaitTell(t, ctx, fmt.Sprintf("%d events unpublished", want), func() bool {
		if err := pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == want
	}, func() string { return fmt.Sprintf("%d events still unpublished", n) })
}

// TestKillMidBatch: a relay killed with SIGKILL after the broker acknowledged a batch
// but before it marked the rows loses nothing, and the next relay publishes that
// batch again at most.
func TestKillMidBatch(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ns := newNATSScope(t)
	const n, batch = 1000, 50
	want := writeEvents(t, pool, table, 7, n)
	args := []string{"--db", url, "--table", table.Schema + "." + table.Name, "--broker", ns.url,
		"--topic-template", ns.template(), "--batch-size", fmt.Sprint(batch)}

	first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=relay.after-publish-before-mark:4"}, args...)
	first.killedByFailpoint(t)
	second := startRelayProc(t, nil, args...)
	waitUnpublished(t, pool, table, 0, 60*time.Second)
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	<-second.done

	checkOrder(t, want, ns.read(t, n))
	// The core subscription may still be receiving; wait for every id to show.
	var dups, distinct int
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testenv.Wait(t, wctx, "every id on the subscription", func() bool {
		dups, distinct = ns.duplicates()
		return distinct >= n
	})
	if distinct != n || dups > batch {
		t.Fatalf("%d distinct events published with %d duplicates; want %d and at most one batch (%d)", distinct, dups, n, batch)
	}
	t.Logf("kill after publish, before mark: %d duplicates (batch %d)", dups, batch)
	if !strings.Contains(second.output(), "relay stopped") {
		t.Fatalf("SIGTERM did not stop the relay gracefully:\n%s", second.output())
	}
}

// TestFailover: the active relay is killed while producers write; the standby takes
// over within seconds and order per aggregate holds across the handover.
func TestFailover(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ns := newNATSScope(t)
	args := []string{"--db", url, "--table", table.Schema + "." + table.Name, "--broker", ns.url,
		"--topic-template", ns.template(), "--batch-size", "20", "--poll-interval", "50ms"}

	active := startRelayProc(t, nil, args...)
	want := writeEvents(t, pool, table, 5, 200)
	waitUnpublished(t, pool, table, 0, 30*time.Second)
	standby := startRelayProc(t, nil, args...)
	// The standby says it waits (once), rather than nothing at all.
	testenv.Wait(t, context.Background(), "the standby relay's 'standby' line", func() bool {
		return strings.Contains(standby.output(), "relay: standby")
	})

	count := func() (n int64) {
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table.Schema, table.Name}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	var more map[string][]string
	done := make(chan struct{})
	go func() {
		defer close(done)
		more = writeEvents(t, pool, table, 5, 1000)
	}()
	// The active relay is killed while the producers write.
	testenv.Wait(t, context.Background(), "the producers writing", func() bool { return count() > before })
	_ = active.cmd.Process.Kill()
	<-active.done
	killed := time.Now()
	<-done
	waitUnpublished(t, pool, table, 0, 30*time.Second)
	t.Logf("standby drained the backlog %v after the kill", time.Since(killed).Round(time.Millisecond))
	for k, ids := range more {
		want[k] = append(want[k], ids...)
	}
	checkOrder(t, want, ns.read(t, 1200))
	if !strings.Contains(standby.output(), "relay: active") {
		t.Fatalf("the standby never took over:\n%s", standby.output())
	}
}

// TestDemo runs `outbox demo` end to end, as the README's first command does, only
// shorter, and checks its verdict.
func TestDemo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(binary, "demo", "--duration", "3s", "--rate", "300", "--dir", dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	for _, want := range []string{"lost 0 [ok]", "phantoms 0 [ok]", "order violations 0 [ok]", "consumed = committed [ok]",
		"relay 1 killed (SIGKILL)     yes", "redeliveries skipped          25"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "orders.db")); err != nil {
		t.Errorf("--dir was not used: %v", err)
	}
	// Nothing left running: the relay process is gone (the port of the in-process
	// NATS server died with the demo).
	if strings.Contains(string(out), "panic") {
		t.Fatalf("panic in demo output:\n%s", out)
	}
}

func TestDLQCommands(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ids := writeEvents(t, pool, table, 2, 4) // agg-0: 0, 2; agg-1: 1, 3
	store, _ := outboxpgx.New(pool, &table).Store()
	ctx := context.Background()
	c, err := store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	// agg-0's first event dies and holds its aggregate; the rest stay unpublished.
	first := ids["agg-0"][0]
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{
		{ID: first, Error: "message too large", CountAttempt: true, Dead: true, HoldKey: true}}}); err != nil {
		t.Fatal(err)
	}
	tbl := table.Schema + "." + table.Name
	out, stderr, code := runCLI(t, nil, "dlq", "list", "--db", url, "--table", tbl)
	if code != 0 || !strings.Contains(out, first) || !strings.Contains(out, "message too large") {
		t.Fatalf("dlq list: %d %s %s", code, out, stderr)
	}
	out, _, code = runCLI(t, nil, "dlq", "list", "--db", url, "--table", tbl, "--aggregate-id", "agg-1", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("dlq list filtered: %d %q", code, out)
	}
	// An id that is not a UUID is one no dead letter has: said plainly, no SQLSTATE.
	if _, stderr, code := runCLI(t, nil, "dlq", "show", "not-a-uuid", "--db", url, "--table", tbl); code != 1 || !strings.Contains(stderr, "no dead letter with id not-a-uuid") {
		t.Fatalf("dlq show of a non-UUID id: %d %s", code, stderr)
	}
	if out, stderr, code := runCLI(t, nil, "dlq", "replay", "not-a-uuid", "--db", url, "--table", tbl); code != 0 || !strings.Contains(out, "replayed 0") {
		t.Fatalf("dlq replay of a non-UUID id: %d %s %s", code, out, stderr)
	}
	out, _, code = runCLI(t, nil, "dlq", "show", first, "--db", url, "--table", tbl)
	if code != 0 || !strings.Contains(out, `"holds_key": true`) || !strings.Contains(out, `"payload": {`) {
		t.Fatalf("dlq show: %d %s", code, out)
	}
	out, _, code = runCLI(t, nil, "status", "--db", url, "--table", tbl)
	if code != 0 || !strings.Contains(out, "dead letters:          1 (holding 1 aggregates") {
		t.Fatalf("status: %d %s", code, out)
	}
	_, stderr, code = runCLI(t, nil, "dlq", "purge", "--db", url, "--table", tbl)
	if code != 2 || !strings.Contains(stderr, "--all") {
		t.Fatalf("purge without a filter: %d %s", code, stderr)
	}
	// The dead letter is fixed before its replay: a smaller payload, a header set.
	payloadFile := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(payloadFile, []byte(`{"fixed":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runCLI(t, nil, "dlq", "edit", first, "--db", url, "--table", tbl); code != 2 || !strings.Contains(stderr, "--payload") {
		t.Fatalf("dlq edit with nothing to change: %d %s", code, stderr)
	}
	out, stderr, code = runCLI(t, nil, "dlq", "edit", first, "--payload-file", payloadFile, "--header", "schemaVersion=2", "--db", url, "--table", tbl)
	if code != 0 || !strings.Contains(out, "edited dead letter") {
		t.Fatalf("dlq edit: %d %s %s", code, out, stderr)
	}
	if _, stderr, code := runCLI(t, nil, "dlq", "edit", "01a232ba-52e6-78df-865f-a7c25166e5cb", "--payload", "{}", "--db", url, "--table", tbl); code != 1 || !strings.Contains(stderr, "no dead letter") {
		t.Fatalf("dlq edit of an unknown id: %d %s", code, stderr)
	}
	out, _, code = runCLI(t, nil, "dlq", "replay", first, "--db", url, "--table", tbl)
	if code != 0 || !strings.Contains(out, "replayed 1") {
		t.Fatalf("dlq replay: %d %s", code, out)
	}
	c, err = store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx)
	if got := c.Rows(); len(got) != 4 || got[0].ID != first {
		t.Fatalf("after replay the first claimed row is %v, want the replayed event first of 4", got)
	}
	if r := c.Rows()[0]; string(r.Payload) != `{"fixed": true}` || r.Headers["schemaVersion"] != "2" {
		t.Fatalf("the replayed event: payload %s, headers %v; want the edited ones", r.Payload, r.Headers)
	}
}

// TestRelayToStdout runs `outbox relay --broker stdout:` and reads its JSON lines.
func TestRelayToStdout(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	want := writeEvents(t, pool, table, 3, 30)
	p := startRelayProc(t, nil, "--db", url, "--table", table.Schema+"."+table.Name, "--broker", "stdout:", "--log-level", "error")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testenv.WaitTell(t, ctx, "30 JSON lines", func() bool { return strings.Count(p.output(), "\n") >= 30 }, p.output)
	out := p.output()
	var first struct {
		ID      string            `json:"id"`
		Topic   string            `json:"topic"`
		Key     string            `json:"key"`
		Headers map[string]string `json:"headers"`
		Payload json.RawMessage   `json:"payload"`
	}
	if err := json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &first); err != nil {
		t.Fatalf("not a JSON line: %v\n%s", err, out)
	}
	if first.ID != want["agg-0"][0] || first.Topic != "outbox.event.order" || first.Key != "agg-0" ||
		first.Headers["id"] != first.ID || first.Headers["eventType"] != "Step" || len(first.Payload) == 0 {
		t.Fatalf("first line = %+v", first)
	}
}

// TestRelayConfigFile: a properties file with a Debezium connector's router options
// (copied with their transforms. prefix) and relay flags drives the relay.
func TestRelayConfigFile(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	writeEvents(t, pool, table, 1, 3)
	cfg := filepath.Join(t.TempDir(), "relay.properties")
	err := os.WriteFile(cfg, []byte(`# relay settings
db=`+url+`
table: `+table.Schema+`.outbox
broker=stdout:
log-level=error
# copied from the Kafka Connect connector
transforms.outbox.route.topic.replacement=${routedByValue}.events
transforms.outbox.table.fields.additional.placement=type:header:eventType
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	p := startRelayProc(t, nil, "--config", cfg) // (its --log-level debug wins over the file's)
	var line string
	testenv.WaitTell(t, context.Background(), "a JSON line", func() bool {
		for _, l := range strings.Split(p.output(), "\n") {
			if strings.HasPrefix(l, "{") {
				line = l
				return true
			}
		}
		return false
	}, p.output)
	if !strings.Contains(line, `"topic":"order.events"`) || !strings.Contains(line, `"eventType":"Step"`) || strings.Contains(line, `"aggregateType"`) {
		t.Fatalf("first line: %s", line)
	}
	_, stderr, code := runCLI(t, nil, "relay", "--config", filepath.Join(t.TempDir(), "missing"))
	if code != 2 || !strings.Contains(stderr, "--config") {
		t.Fatalf("missing config: %d %s", code, stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad.properties")
	_ = os.WriteFile(bad, []byte("route.by.field=tenant\n"), 0o600)
	_, stderr, code = runCLI(t, nil, "relay", "--config", bad, "--broker", "stdout:", "--db", url, "--table", table.Schema+".outbox")
	if code != 2 || !strings.Contains(stderr, `column "tenant", which table`) {
		t.Fatalf("bad router option: %d %s", code, stderr)
	}
}

// TestRelayConnectorJSON: a Kafka Connect REST body pasted as it is (connector keys,
// the transforms lines, converters) drives the relay with the router; the connector's
// own keys are reported once; a config with no router in it is refused.
func TestRelayConnectorJSON(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	writeEvents(t, pool, table, 1, 1)
	cfg := filepath.Join(t.TempDir(), "connector.json")
	err := os.WriteFile(cfg, []byte(`{"name": "outbox-connector", "config": {
  "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
  "database.hostname": "db", "database.password": "hunter2", "tasks.max": 1,
  "topic.prefix": "dbserver1",
  "transforms": "outbox",
  "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
  "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
  "value.converter": "org.apache.kafka.connect.json.JsonConverter",
  "value.converter.schemas.enable": "false"}}`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	p := startRelayProc(t, nil, "--config", cfg, "--db", url, "--table", table.Schema+".outbox", "--broker", "stdout:")
	testenv.WaitTell(t, context.Background(), "a record on order.events", func() bool {
		return strings.Contains(p.output(), `"topic":"order.events"`)
	}, p.output)
	out := p.output()
	// JsonConverter, schemas off: the jsonb payload is a JSON string.
	// JsonConverter with schemas off: the jsonb payload is a JSON string literal;
	// the key stays StringConverter's (no key.converter line).
	if !strings.Contains(out, `"key":"agg-0","headers":{"id":`) || !strings.Contains(out, `"payload":"{\"pad\": `) {
		t.Fatalf("record not as JsonConverter writes it:\n%s", out)
	}
	if !strings.Contains(out, "database.hostname,database.password,tasks.max") || strings.Contains(out, "hunter2") {
		t.Fatalf("ignored keys not reported once, or a value echoed:\n%s", out)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	_ = os.WriteFile(bad, []byte(`{"config": {"database.hostname": "db"}}`), 0o600)
	_, stderr, code := runCLI(t, nil, "relay", "--config", bad, "--broker", "stdout:")
	if code != 2 || !strings.Contains(stderr, "unknown keys database.hostname") {
		t.Fatalf("a connector config without the router: %d %s", code, stderr)
	}
}

func TestCleanupCommand(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ids := writeEvents(t, pool, table, 1, 4)["agg-0"]
	store, _ := outboxpgx.New(pool, &table).Store()
	ctx := context.Background()
	c, err := store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: []string{ids[0], ids[1], ids[2]}}); err != nil {
		t.Fatal(err)
	}
	tbl := table.Schema + "." + table.Name
	out, stderr, code := runCLI(t, nil, "cleanup", "--db", url, "--table", tbl)
	if code != 0 || !strings.Contains(out, "deleted 0 ") {
		t.Fatalf("cleanup with the default retention: %d %s %s", code, out, stderr)
	}
	out, stderr, code = runCLI(t, nil, "cleanup", "--db", url, "--table", tbl, "--older-than", "1ns", "--batch", "2")
	if code != 0 || !strings.Contains(out, "deleted 3 ") {
		t.Fatalf("cleanup: %d %s %s", code, out, stderr)
	}
	st, _ := store.Status(ctx)
	if st.Unpublished != 1 || st.Published != 0 {
		t.Fatalf("status after cleanup: %+v", st)
	}
}

// TestRelayHTTP: /healthz, /readyz and /metrics on the address given.
func TestRelayHTTP(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	writeEvents(t, pool, table, 2, 10)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	startRelayProc(t, nil, "--db", url, "--table", table.Schema+"."+table.Name, "--broker", "stdout:", "--http", addr)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var code int
	var body string
	testenv.WaitTell(t, context.Background(), "/metrics to show the 10 events published", func() bool {
		code, body = get("/metrics")
		// Every relay series names its table (the build's does not: it is the process's).
		tbl := `table="` + table.Schema + "." + table.Name + `"`
		return code == 200 && strings.Contains(body, `outbox_relay_published_total{`+tbl+`,topic="outbox.event.order"} 10`) &&
			strings.Contains(body, "outbox_unpublished_events{"+tbl+"} 0") && strings.Contains(body, "outbox_relay_leader{"+tbl+"} 1") &&
			strings.Contains(body, "outbox_build_info{goversion=")
	}, func() string { return fmt.Sprintf("/metrics: %d\n%s", code, body) })
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 200 || !strings.Contains(body, "active") {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	// The dashboard, on the same listener, shows this relay's work.
	if code, body := get("/ui/?partial=1"); code != 200 || !strings.Contains(body, `id="published">10<`) || !strings.Contains(body, `id="relay-role">active<`) {
		t.Fatalf("/ui/: %d %s", code, body)
	}
}

// TestUICommand: `outbox ui` serves the dashboard of a table with no relay in the
// process, and reads the flow from a relay's /metrics when told where.
func TestUICommand(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	writeEvents(t, pool, table, 2, 5)
	other := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	writeEvents(t, pool, other, 2, 3)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"table", []string{"--db", url, "--table", table.String()}, []string{`id="backlog">5<`}},
		// Many tables: one page listing them, each with its pages.
		{"tables", []string{"--db", url, "--tables", table.String() + "," + other.String()},
			[]string{`id="backlog">8<`, `data-table="` + table.String() + `"`, `data-table="` + other.String() + `"`}},
		// The same on SQLite, whose tables all live in main.
		{"tables-sqlite", []string{"--db", sqliteTenants(t), "--tables", "tenant_*"},
			[]string{`id="tables">2<`, `data-table="main.tenant_1"`, `data-table="main.tenant_2"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			cmd := exec.Command(binary, append([]string{"ui", "--listen", addr, "--metrics", "http://127.0.0.1:1/metrics"}, tc.args...)...)
			out := &lockedWriter{w: &bytes.Buffer{}}
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			var page string
			testenv.WaitTell(t, context.Background(), "outbox ui showing the backlog", func() bool {
				resp, err := http.Get("http://" + addr + "/ui/")
				if err != nil {
					return false
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				page = string(b)
				for _, w := range tc.want {
					if !strings.Contains(page, w) {
						return false
					}
				}
				return resp.StatusCode == 200
			}, func() string {
				out.mu.Lock()
				defer out.mu.Unlock()
				return out.w.String() + "\n" + page
			})
		})
	}
}

// sqliteTenants is a SQLite database with two migrated outbox tables, tenant_1 and
// tenant_2, as a --db URL.
func sqliteTenants(t *testing.T) string {
	t.Helper()
	url := "sqlite://" + filepath.Join(t.TempDir(), "tenants.db")
	if stdout, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--tables", "tenant_1,tenant_2"); code != 0 {
		t.Fatalf("migrate --tables: exit %d\n%s%s", code, stdout, stderr)
	}
	return url
}

func TestReadYAMLConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.yaml")
	err := os.WriteFile(path, []byte(`# relay
db: "postgres://app@db:5432/app?sslmode=disable"
batch-size: 500
delete: true
transforms:
  outbox:
    route.topic.replacement: "${routedByValue}.events"
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"db": "postgres://app@db:5432/app?sslmode=disable", "batch-size": "500", "delete": "true",
		"transforms.outbox.route.topic.replacement": "${routedByValue}.events"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	_ = os.WriteFile(path, []byte("db: [a, b]\n"), 0o600)
	if _, err := readConfigFile(path); err == nil {
		t.Fatal("a list value was accepted")
	}
}

// TestRelayExportsSpans: with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, the relay opens
// a publish span per traced event, continues the producer's trace in the broker
// headers, and exports the spans over OTLP/HTTP.
func TestRelayExportsSpans(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	var mu sync.Mutex
	exports := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			mu.Lock()
			exports++
			mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	const traceID, parentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if _, err := pool.Exec(context.Background(), "INSERT INTO "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+
		" (id, aggregatetype, aggregateid, type, payload, tracingspancontext) VALUES (gen_random_uuid(), 'order', '1', 'T', '{}', $1)",
		"traceparent=00-"+traceID+"-"+parentSpan+"-01"); err != nil {
		t.Fatal(err)
	}
	p := startRelayProc(t, []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + srv.URL + "/v1/traces", "OTEL_BSP_SCHEDULE_DELAY=50"},
		"--db", url, "--table", table.Schema+"."+table.Name, "--broker", "stdout:", "--log-level", "error")
	var n int
	testenv.WaitTell(t, context.Background(), "a span exported and the publish span's traceparent on the message", func() bool {
		mu.Lock()
		n = exports
		mu.Unlock()
		return n > 0 && strings.Contains(p.output(), `"traceparent":"00-`+traceID+`-`)
	}, func() string { return fmt.Sprintf("exports=%d, output:\n%s", n, p.output()) })
	if out := p.output(); strings.Contains(out, parentSpan) {
		t.Fatalf("the broker header still names the producer's span, not the publish span:\n%s", out)
	}
}

// TestMySQLCommands: migrate and status on the machine's MariaDB through mysql://.
func TestMySQLCommands(t *testing.T) {
	testenv.ServiceURL(t, "TEST_MYSQL_DSN", "", "127.0.0.1:3306", "MariaDB")
	table := testenv.UniqueName("outbox_")
	url := "mysql://root@127.0.0.1:3306/test"
	t.Cleanup(func() {
		db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
		if err != nil {
			return
		}
		defer db.Close()
		for _, s := range []string{"", "_dead", "_migrations"} {
			_, _ = db.Exec("DROP TABLE IF EXISTS `" + table + s + "`")
		}
	})
	out, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", table)
	if code != 0 || !strings.Contains(out, "applied migrations [1]") {
		t.Fatalf("migrate: %d %s %s", code, out, stderr)
	}
	out, stderr, code = runCLI(t, nil, "status", "--db", url, "--table", table, "--json")
	if code != 0 || !strings.Contains(out, `"unpublished": 0`) {
		t.Fatalf("status: %d %s %s", code, out, stderr)
	}
	_, stderr, code = runCLI(t, nil, "status", "--db", "mysql://root:hunter2@127.0.0.1:1/test")
	if code != 1 || !strings.Contains(stderr, "cannot reach the database") || strings.Contains(stderr, "hunter2") {
		t.Fatalf("unreachable MySQL: %d %s", code, stderr)
	}
	_, stderr, code = runCLI(t, nil, "status", "--db", "mysql://root@127.0.0.1")
	if code != 2 || !strings.Contains(stderr, "want mysql://") {
		t.Fatalf("MySQL URL without a database: %d %s", code, stderr)
	}
}

// TestSchemaVersionChecked: the relay refuses a table migrated by a newer version, or
// lacking a migration this version knows, in one line that says what to do; status
// says where the schema stands.
func TestSchemaVersionChecked(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	name := table.Schema + "." + table.Name
	versions := pgx.Identifier{table.Schema, table.Name + "_migrations"}.Sanitize()
	stdout, stderr, code := runCLI(t, nil, "status", "--db", url, "--table", name)
	if code != 0 || !strings.Contains(stdout, "version 11 (current)") {
		t.Fatalf("status: exit %d\n%s%s", code, stdout, stderr)
	}
	relay := []string{"relay", "--db", url, "--table", name, "--broker", "stdout:", "--http", ""}
	execSQL := func(sql string) {
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}

	execSQL("INSERT INTO " + versions + " (version) VALUES (999)")
	_, stderr, code = runCLI(t, nil, relay...)
	if code != 1 || !strings.Contains(stderr, "newer than this build") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("relay on a newer schema: exit %d\n%s", code, stderr)
	}
	// A rollback runs an older relay on the newer schema, when told to.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	if code := run(ctx, append(relay, "--allow-newer-schema"), &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "--allow-newer-schema") {
		t.Fatalf("relay --allow-newer-schema: exit %d\n%s", code, errOut.String())
	}
	execSQL("DELETE FROM " + versions + " WHERE version IN (10, 999)")
	_, stderr, code = runCLI(t, nil, relay...)
	if code != 1 || !strings.Contains(stderr, "older than this build") || !strings.Contains(stderr, "outbox migrate") {
		t.Fatalf("relay on an older schema: exit %d\n%s", code, stderr)
	}
	if stdout, _, _ := runCLI(t, nil, "status", "--db", url, "--table", name); !strings.Contains(stdout, "lacks migrations [10]") {
		t.Fatalf("status of an older schema:\n%s", stdout)
	}
}

// TestRetryNow: an event that waits for its retry (its stream did not exist) goes out
// on the relay's next pass after `outbox retry`, not after its backoff.
func TestRetryNow(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	name := table.Schema + "." + table.Name
	writeEvents(t, pool, table, 1, 1)
	q := "UPDATE " + pgx.Identifier{table.Schema, table.Name}.Sanitize() + " SET attempts = 3, last_error = 'no stream', available_at = now() + interval '1 hour'"
	if _, err := pool.Exec(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runCLI(t, nil, "retry", "--db", url, "--table", name); code != 2 || !strings.Contains(stderr, "--all") {
		t.Fatalf("retry without a selection: exit %d %s", code, stderr)
	}
	p := startRelayProc(t, nil, "--db", url, "--table", name, "--broker", "stdout:", "--log-level", "error", "--http", "")
	stdout, stderr, code := runCLI(t, nil, "retry", "--db", url, "--table", name, "--all")
	if code != 0 || !strings.HasPrefix(stdout, "1 waiting event(s) due now") {
		t.Fatalf("retry --all: exit %d %s%s", code, stdout, stderr)
	}
	waitUnpublished(t, pool, table, 0, 30*time.Second)
	if !strings.Contains(p.output(), `"outbox-seq":"1"`) {
		t.Fatalf("relay output:\n%s", p.output())
	}
}

// TestTableMissingColumns: a table made by hand with only the Debezium columns (no
// migration ran) gets one line saying to run outbox migrate, not a SQLSTATE.
func TestTableMissingColumns(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	schema := testenv.Schema(t, url)
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+pgx.Identifier{schema, "outbox"}.Sanitize()+
		" (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)"); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := runCLI(t, nil, "status", "--db", url, "--table", schema+".outbox")
	if code != 1 || !strings.Contains(stderr, "run `outbox migrate`") || strings.Contains(stderr, "SQLSTATE") {
		t.Fatalf("status of a table without the outbox's columns: exit %d\n%s", code, stderr)
	}
}

// maxDemoModules bounds the modules from outside this project that provide the CLI's
// packages, which the README's first command (go run ./cmd/outbox demo) downloads and
// compiles: a dependency added to the CLI moves it, and docs/benchmarks.md's cold first
// run with it. The project's own modules are in the checkout: not counted.
const maxDemoModules = 92

// TestDemoModules counts them (go list -deps).
func TestDemoModules(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	mods, own := map[string]bool{}, map[string]bool{}
	for _, m := range strings.Fields(string(out)) {
		if m == "github.com/outboxd/outbox" || strings.HasPrefix(m, "github.com/outboxd/outbox/") {
			own[m] = true
		} else {
			mods[m] = true
		}
	}
	if len(mods) > maxDemoModules {
		t.Errorf("%d modules from outside the project provide the CLI's packages, over %d: a new dependency costs every first run (docs/benchmarks.md)", len(mods), maxDemoModules)
	}
	t.Logf("%d modules from outside the project, %d of its own", len(mods), len(own))
}
