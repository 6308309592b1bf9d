// Package poison_test is the poison suite: thousands of good events written by plain
// SQL next to rows of every known bad class and generated junk, relayed by the real
// relay, with its default settings, to every real broker and from every database
// driver. It checks the rule of DESIGN 3.7: a failure belongs to the message that
// caused it unless it provably belongs to the connection.
//
// Invariants, for every broker and driver:
//   - every good event is delivered (at least once), in order per aggregate, with its
//     payload intact, within 30 s;
//   - no good event is in the dead letters;
//   - every bad event is delivered or dead with a reason;
//   - the relay never stops on its own.
package poison_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/google/uuid"
	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The Pub/Sub client's OpenCensus and gRPC workers outlive a test.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

const (
	goodAggregates = 40
	goodPerAgg     = 50 // 2,000 good events per run
	deadline       = 30 * time.Second
)

// db is a migrated outbox table on one database, and how to insert rows into it by
// plain SQL.
type db struct {
	name  string
	store outboxdriver.Store
	sql   *sql.DB
	// insert is the plain-SQL INSERT of (id, aggregatetype, aggregateid, type,
	// payload, headers, tracingspancontext), with the database's placeholders.
	insert string
	// accepts reports whether the database stores r as given (PostgreSQL text is
	// valid UTF-8 without NUL and its payload is JSON; MariaDB text is valid UTF-8).
	accepts func(r *row) bool
}

// row is one event as a producer in any language could write it.
type row struct {
	id, aggregateType, aggregateID, typ string
	payload                             []byte // nil: NULL
	headers, trace                      *string
	class                               string // "" for a good event
}

// pub is a publisher under test and the topic template that keeps its topics apart.
type pub struct {
	name     string
	p        broker.Publisher
	template string
	// received, when set, returns what the broker's receiving end got by event id
	// (the webhook receiver), to check payloads end to end.
	received func() map[string][]byte
}

func str(s string) *string { return &s }

// badRows are the known classes (issue #13, DESIGN 3.7, shared/reference), each on
// an aggregate of its own: a bad event holds back only its own aggregate.
func badRows() []row {
	bad := func(class, at, aid, typ string, payload []byte, headers, trace *string) row {
		return row{id: uuid.NewString(), aggregateType: at, aggregateID: aid, typ: typ, payload: payload, headers: headers, trace: trace, class: class}
	}
	j := []byte(`{"bad":true}`)
	return []row{
		bad("aggregatetype not UTF-8", "order\xff\xfe", "bad-1", "T", j, nil, nil),
		bad("header name with a space", "order", "bad-2", "T", j, str(`{"bad name":"x"}`), nil),
		bad("header name with a colon", "order", "bad-3", "T", j, str(`{"a:b":"x"}`), nil),
		bad("header value with CRLF", "order", "bad-4", "T", j, str(`{"h":"a\r\nforged: 1"}`), nil),
		bad("header name not ASCII", "order", "bad-5", "T", j, str(`{"ключ":"x"}`), nil),
		bad("headers not an object", "order", "bad-6", "T", j, str(`[1,2]`), nil),
		bad("header value not a string", "order", "bad-7", "T", j, str(`{"n":1}`), nil),
		bad("aggregateid with a newline", "order", "bad-8\nforged", "T", j, nil, nil),
		bad("aggregateid with terminal escapes", "order", "bad-9\x1b]0;pwn\x07\x1b[2K\r", "T", j, nil, nil),
		bad("aggregateid empty", "order", "", "T", j, nil, nil),
		bad("aggregateid 1000 bytes", "order", "bad-11-"+strings.Repeat("k", 993), "T", j, nil, nil),
		bad("aggregateid with NUL", "order", "bad-12\x00x", "T", j, nil, nil),
		bad("aggregatetype with subject syntax", "or.der *>", "bad-13", "T", j, nil, nil),
		bad("aggregatetype empty", "", "bad-14", "T", j, nil, nil),
		bad("aggregatetype 250 bytes", strings.Repeat("t", 250), "bad-15", "T", j, nil, nil),
		bad("aggregatetype with MQTT wildcards", "a/+/#", "bad-16", "T", j, nil, nil),
		bad("type with a newline", "order", "bad-17", "T\nforged", j, nil, nil),
		bad("payload over 1 MB", "order", "bad-18", "T", []byte(`{"pad":"`+strings.Repeat("p", 1<<20)+`"}`), nil, nil),
		bad("payload NULL", "order", "bad-19", "T", nil, nil, nil),
		bad("payload not JSON", "order", "bad-20", "T", []byte{0xff, 0x00, 0x01}, nil, nil),
		bad("payload empty", "order", "bad-21", "T", []byte{}, nil, nil),
		bad("trace context junk", "order", "bad-22", "T", j, nil, str("traceparent=\x01\ntracestate=\xff\n=")),
		bad("a thousand headers", "order", "bad-23", "T", j, str(manyHeaders(1000)), nil),
		bad("header value 8 KB", "order", "bad-24", "T", j, str(`{"big":"`+strings.Repeat("v", 8<<10)+`"}`), nil),
		bad("type empty", "order", "bad-25", "", j, nil, nil),
		bad("header name 300 bytes", "order", "bad-26", "T", j, str(`{"`+strings.Repeat("n", 300)+`":"x"}`), nil),
		bad("type 300 bytes", "order", "bad-27", strings.Repeat("T", 300), j, nil, nil),
		// Too long for a btree index entry (PostgreSQL's limit is 2704 bytes): a key that
		// cannot be indexed must still end delivered or dead, not wedge its batch.
		bad("aggregatetype 3 KB of Unicode", strings.Repeat("ü", 1512), "bad-29", "T", j, nil, nil),
		bad("aggregateid a million bytes", "order", "bad-30-"+strings.Repeat("k", 1_000_000), "T", j, nil, nil),
		withID(bad("id not a UUID", "order", "bad-28", "T", j, nil, nil), "id:"+uuid.NewString()[:8]+" \x1b[2K.*>"),
	}
}

// withID gives r an id of its own choosing (a plain-SQL producer's on MariaDB or SQLite,
// where the id column is text).
func withID(r row, id string) row {
	r.id = id
	return r
}

func manyHeaders(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"h%d":"%d"`, i, i)
	}
	b.WriteString("}")
	return b.String()
}

// junkRows are generated: random text in every text column and random headers, each
// on an aggregate of its own (rapid's generators: control characters, topic syntax,
// and letters, digits, punctuation and symbols of all of Unicode).
func junkRows(n int) []row {
	text := rapid.StringOf(rapid.RuneFrom([]rune{0, 0x1b, '\n', '\r', '\t', '.', '*', '>', '/', '+', '#', ' ', ':', '%', 0x7f},
		unicode.L, unicode.N, unicode.P, unicode.S, unicode.Cc))
	out := make([]row, 0, n)
	for i := range n {
		hdr, _ := json.Marshal(map[string]string{text.Example(5 * i): text.Example(5*i + 1)})
		out = append(out, row{
			id:            uuid.NewString(),
			aggregateType: text.Example(5*i + 2),
			aggregateID:   fmt.Sprintf("junk-%d-%s", i, text.Example(5*i+3)),
			typ:           text.Example(5*i + 4),
			payload:       []byte(fmt.Sprintf(`{"junk":%d}`, i)),
			headers:       str(string(hdr)),
			class:         "generated junk",
		})
	}
	return out
}

func goodRows() []row {
	rows := make([]row, 0, goodAggregates*goodPerAgg)
	for i := range goodPerAgg {
		for a := range goodAggregates {
			rows = append(rows, row{
				id: uuid.NewString(), aggregateType: "order", aggregateID: fmt.Sprintf("good-%d", a), typ: "Step",
				payload: []byte(fmt.Sprintf(`{"agg":%d,"i":%d}`, a, i)),
				headers: str(`{"correlationId":"c-` + fmt.Sprint(i) + `"}`),
			})
		}
	}
	return rows
}

// interleave puts the bad rows among the good ones, spread over the whole backlog.
func interleave(good, bad []row) []row {
	out := make([]row, 0, len(good)+len(bad))
	step := max(len(good)/(len(bad)+1), 1)
	b := 0
	for i, g := range good {
		if i%step == 0 && b < len(bad) {
			out = append(out, bad[b])
			b++
		}
		out = append(out, g)
	}
	return append(out, bad[b:]...)
}

func (d *db) write(t *testing.T, rows []row) (written []row) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.sql.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	for i := range rows {
		r := &rows[i]
		if r.class != "" && !d.accepts(r) {
			continue // the database itself refuses it: nothing for the relay to see
		}
		var payload any
		if r.payload != nil {
			payload = r.payload
		}
		var headers, trace any
		if r.headers != nil {
			headers = *r.headers
		}
		if r.trace != nil {
			trace = *r.trace
		}
		if _, err := tx.ExecContext(ctx, d.insert, r.id, r.aggregateType, r.aggregateID, r.typ, payload, headers, trace); err != nil {
			t.Fatalf("%s: insert %q (%s): %v", d.name, r.id, r.class, err)
		}
		written = append(written, *r)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return written
}

// recorder is the relay's hooks: what the broker acknowledged, in order.
type recorder struct {
	mu    sync.Mutex
	acked []outboxdriver.Row
}

func (r *recorder) BatchPublished(outcomes []relay.Outcome, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range outcomes {
		if o.Err == nil {
			r.acked = append(r.acked, *o.Row)
		}
	}
}
func (r *recorder) LeaderChanged(bool) {}

func (r *recorder) snapshot() []outboxdriver.Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outboxdriver.Row(nil), r.acked...)
}

// maxLogLine bounds a log line of the relay's: a stored error is at most 1000 bytes,
// and each of a row's values in a line at most safetext.LogMax.
const maxLogLine = 4 << 10

// lineMeter is a log handler's writer that keeps the longest line (a slog handler
// writes one record per Write).
type lineMeter struct {
	mu  sync.Mutex
	max int
}

func (m *lineMeter) Write(p []byte) (int, error) {
	m.mu.Lock()
	m.max = max(m.max, len(p))
	m.mu.Unlock()
	if os.Getenv("TEST_DEBUG") != "" {
		_, _ = os.Stderr.Write(p)
	}
	return len(p), nil
}

func (m *lineMeter) longest() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.max
}

// run relays rows written to d through p with the relay's defaults and checks the
// invariants.
func run(t *testing.T, d *db, p *pub) {
	t.Helper()
	good := goodRows()
	written := d.write(t, interleave(good, append(badRows(), junkRows(60)...)))
	rec := &recorder{}
	lines := &lineMeter{}
	r, err := relay.New(d.store, p.p, &relay.Config{TopicTemplate: p.template, Hooks: rec,
		Logger: slog.New(slog.NewTextHandler(lines, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// A row's value reaches a log line cut (a million-byte key made a 1 MB line
		// per event, for ever).
		if n := lines.longest(); n > maxLogLine {
			t.Errorf("the relay logged a line of %d bytes (at most %d expected)", n, maxLogLine)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()

	bad := map[string]row{}
	for _, w := range written {
		if w.class != "" {
			bad[w.id] = w
		}
	}
	start := time.Now()
	var acked []outboxdriver.Row
	var dead map[string]outboxdriver.DeadLetter
	wctx, wcancel := context.WithTimeout(context.Background(), deadline)
	defer wcancel()
	testenv.WaitTell(t, wctx, "every good event delivered and every bad one resolved", func() bool {
		select {
		case err := <-runErr:
			runErr <- err
			t.Fatalf("the relay stopped on its own: %v", err)
		default:
		}
		acked = rec.snapshot()
		dead = deadLetters(t, d.store)
		return goodDone(acked) == len(good) && resolved(acked, dead, bad) == len(bad)
	}, func() string {
		var b strings.Builder
		for id, bd := range bad {
			if !isAcked(acked, id) && dead[id].ID == "" {
				fmt.Fprintf(&b, "bad event %q (%s) neither delivered nor dead\n", id, bd.class)
			}
		}
		fmt.Fprintf(&b, "%d of %d good events delivered, %d of %d bad events resolved", goodDone(acked), len(good), resolved(acked, dead, bad), len(bad))
		return b.String()
	})
	checkOrder(t, acked)
	for id, dl := range dead {
		b, ok := bad[id]
		if !ok {
			t.Errorf("a good event is in the dead letters: %s %q: %s", id, dl.AggregateID, dl.Error)
			continue
		}
		if dl.Error == "" {
			t.Errorf("bad event %q (%s) is dead without a reason", id, b.class)
		}
	}
	if p.received != nil {
		got := p.received()
		for _, g := range good {
			if body, ok := got[g.id]; !ok || !sameJSON(body, g.payload) {
				t.Fatalf("good event %s: the receiver got %q, want %q", g.id, body, g.payload)
			}
		}
	}
	nDead, nDelivered := 0, 0
	for id := range bad {
		if dead[id].ID != "" {
			nDead++
		} else {
			nDelivered++
		}
	}
	t.Logf("%s -> %s: %d good events in %v; %d bad events: %d delivered, %d dead",
		d.name, p.name, len(good), time.Since(start).Round(time.Millisecond), len(bad), nDelivered, nDead)
}

func isAcked(acked []outboxdriver.Row, id string) bool {
	for i := range acked {
		if acked[i].ID == id {
			return true
		}
	}
	return false
}

func resolved(acked []outboxdriver.Row, dead map[string]outboxdriver.DeadLetter, bad map[string]row) int {
	seen := map[string]bool{}
	for i := range acked {
		if _, ok := bad[acked[i].ID]; ok {
			seen[acked[i].ID] = true
		}
	}
	for id := range dead {
		if _, ok := bad[id]; ok {
			seen[id] = true
		}
	}
	return len(seen)
}

// goodDone counts the good events delivered at least once.
func goodDone(acked []outboxdriver.Row) int {
	seen := map[string]bool{}
	for i := range acked {
		if strings.HasPrefix(acked[i].AggregateID, "good-") {
			seen[acked[i].ID] = true
		}
	}
	return len(seen)
}

// checkOrder: per good aggregate, first deliveries come in write order (a repeat of
// an earlier event is allowed), with the payload as written.
func checkOrder(t *testing.T, acked []outboxdriver.Row) {
	t.Helper()
	next := map[string]int{}
	for _, a := range acked {
		if !strings.HasPrefix(a.AggregateID, "good-") {
			continue
		}
		var p struct{ Agg, I *int } // jsonb stores its own key order and spacing
		if err := json.Unmarshal(a.Payload, &p); err != nil || p.Agg == nil || p.I == nil || fmt.Sprintf("good-%d", *p.Agg) != a.AggregateID {
			t.Fatalf("good event %s: payload %q altered", a.ID, a.Payload)
		}
		i := *p.I
		switch n := next[a.AggregateID]; {
		case i == n:
			next[a.AggregateID] = n + 1
		case i > n:
			t.Fatalf("aggregate %s: event %d delivered before event %d", a.AggregateID, i, n)
		}
	}
}

func deadLetters(t *testing.T, s outboxdriver.Store) map[string]outboxdriver.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dls, err := s.ListDead(ctx, &outboxdriver.DeadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]outboxdriver.DeadLetter, len(dls))
	for _, dl := range dls {
		out[dl.ID] = dl
	}
	return out
}

func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}

// TestFlakyReceiver: a webhook endpoint that answers 1 request in 10 with a 500 or a
// 429 gets all of 2,000 events within 30 s with the relay's defaults, in order per
// aggregate, none dead: a refused request is that event's retry, never a backoff of
// the whole publisher.
func TestFlakyReceiver(t *testing.T) {
	d := postgres(t)
	const secret = "whsec_Zmxha3ktcmVjZWl2ZXI="
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		switch {
		case k%20 == 7:
			w.WriteHeader(http.StatusInternalServerError)
		case k%20 == 13:
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	t.Cleanup(srv.Close)
	p, err := webhook.Dial(context.Background(), srv.URL, &webhook.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	good := goodRows()
	d.write(t, good)
	rec := &recorder{}
	relaytest.Start(t, d.store, p, &relay.Config{Hooks: rec, Logger: quietLogger(),
		BackoffMin: relay.BackoffMinDefault, BackoffMax: relay.BackoffMaxDefault})
	start := time.Now()
	wctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	testenv.WaitTell(t, wctx, "every event delivered through a receiver failing 10% of requests", func() bool {
		return goodDone(rec.snapshot()) >= len(good)
	}, func() string { return fmt.Sprintf("%d of %d delivered", goodDone(rec.snapshot()), len(good)) })
	checkOrder(t, rec.snapshot())
	if dead := deadLetters(t, d.store); len(dead) > 0 {
		t.Fatalf("%d events dead behind a flaky receiver", len(dead))
	}
	mu.Lock()
	t.Logf("2000 events through a receiver failing 10%% of %d requests in %v", n, time.Since(start).Round(time.Millisecond))
	mu.Unlock()
}
