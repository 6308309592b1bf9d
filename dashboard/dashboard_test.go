package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/dashboard"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
	"github.com/outboxd/outbox/replay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a migrated outbox table on the machine's PostgreSQL and a dashboard on it.
type fixture struct {
	pool  *pgxpool.Pool
	store outboxdriver.Store
	table outboxdriver.Table
	write func(evs ...outbox.Event) []string
	srv   *httptest.Server
}

func newFixture(t *testing.T, cfg dashboard.Config) *fixture {
	t.Helper()
	return newFixtureWith(t, cfg, nil)
}

// newFixtureWith is newFixture; configure, if set, completes the dashboard's
// configuration with the table's pool.
func newFixtureWith(t *testing.T, cfg dashboard.Config, configure func(*pgxpool.Pool, outboxdriver.Table, *dashboard.Config)) *fixture {
	t.Helper()
	pool, drv := testenv.Outbox(t)
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Admin = store
	cfg.Table = drv.Table().String()
	if configure != nil {
		configure(pool, drv.Table(), &cfg)
	}
	d, err := dashboard.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, d)
	return &fixture{pool: pool, store: store, table: drv.Table(), srv: srv, write: func(evs ...outbox.Event) []string {
		t.Helper()
		ids := make([]string, len(evs))
		for i := range evs {
			if evs[i].ID == "" {
				evs[i].ID = uuid.Must(uuid.NewV7()).String()
			}
			ids[i] = evs[i].ID
		}
		if err := w.Write(context.Background(), evs...); err != nil {
			t.Fatal(err)
		}
		return ids
	}}
}

// serve runs a dashboard (its sampling, and a server) until the test ends.
func serve(t *testing.T, d interface {
	http.Handler
	Run(context.Context)
}) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return srv
}

// kill moves the events to the dead letters as the relay would after a permanent
// refusal.
func (f *fixture) kill(t *testing.T, ids ...string) {
	t.Helper()
	ctx := context.Background()
	c, err := f.store.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var failed []outboxdriver.Failure
	for _, id := range ids {
		failed = append(failed, outboxdriver.Failure{ID: id, Error: "nats: message size exceeds maximum allowed <b>bold</b>", CountAttempt: true, Dead: true, HoldKey: true})
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Failed: failed}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) state(t *testing.T, id string) outboxdriver.EventState {
	t.Helper()
	e, err := f.store.Event(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return e.State
}

// client is a browser-like client: cookies kept, redirects not followed.
func client(t *testing.T) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, c *http.Client, u string, form url.Values, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]*)"`)

// TestActionsNeedTheToken: replay and purge are refused without a session, with a
// wrong token, without the CSRF token and from another site; with all of them the
// dead letter goes back to the outbox.
func TestActionsNeedTheToken(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{Token: "s3cret-admin-token"})
	ids := f.write(outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Placed", Payload: []byte(`{"n":1}`)})
	f.kill(t, ids...)
	u := f.srv.URL + "/ui"
	c := client(t)
	replay := url.Values{"do": {"replay-selected"}, "id": {ids[0]}}

	if code, body := post(t, c, u+"/dead/action", replay); code != http.StatusForbidden || !strings.Contains(body, "sign in") {
		t.Fatalf("anonymous replay: %d %s", code, body)
	}
	if code, _ := post(t, c, u+"/login", url.Values{"token": {"wrong"}}); code != http.StatusForbidden {
		t.Fatalf("wrong token: %d", code)
	}
	if code, _ := post(t, c, u+"/login", url.Values{"token": {"s3cret-admin-token"}}); code != http.StatusSeeOther {
		t.Fatalf("sign in: %d", code)
	}
	if code, _ := post(t, c, u+"/dead/action", replay); code != http.StatusForbidden {
		t.Fatalf("replay without the CSRF token: %d", code)
	}
	_, page := get(t, c, u+"/dead")
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no CSRF token on the dead-letter page of a signed-in admin")
	}
	replay.Set("csrf", m[1])
	if code, _ := post(t, c, u+"/dead/action", replay, "Sec-Fetch-Site", "cross-site"); code != http.StatusForbidden {
		t.Fatalf("replay from another site: %d", code)
	}
	if st := f.state(t, ids[0]); st != outboxdriver.EventDead {
		t.Fatalf("after the refusals the event is %s, want still dead", st)
	}
	code, _ := post(t, c, u+"/dead/action", replay)
	if code != http.StatusSeeOther {
		t.Fatalf("replay: %d", code)
	}
	if st := f.state(t, ids[0]); st != outboxdriver.EventWaiting {
		t.Fatalf("after the replay the event is %s, want waiting", st)
	}
	if _, page := get(t, c, u+"/dead?done=replay&n=1"); !strings.Contains(page, "Replayed 1 dead letter") {
		t.Fatal("no confirmation after the replay")
	}
	// Signed out, the session is gone.
	if code, _ := post(t, c, u+"/logout", url.Values{}); code != http.StatusSeeOther {
		t.Fatalf("sign out: %d", code)
	}
	if _, page := get(t, c, u+"/dead"); !strings.Contains(page, `<span id="role">read-only</span>`) {
		t.Fatal("still an admin after signing out")
	}
}

// TestReadOnly: with no token configured nobody signs in and every action is refused.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{})
	ids := f.write(outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Placed", Payload: []byte(`{}`)})
	f.kill(t, ids...)
	c := client(t)
	u := f.srv.URL + "/ui"
	if code, body := post(t, c, u+"/login", url.Values{"token": {""}}); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Fatalf("sign in on a read-only dashboard: %d", code)
	}
	if code, body := post(t, c, u+"/dead/action", url.Values{"do": {"purge-matching"}}); code != http.StatusForbidden || !strings.Contains(body, "--ui-token") {
		t.Fatalf("purge on a read-only dashboard: %d %s", code, body)
	}
	if st := f.state(t, ids[0]); st != outboxdriver.EventDead {
		t.Fatalf("event is %s after a refused purge", st)
	}
}

// TestUntrustedValuesEscaped: every field of an event is untrusted input; none
// reaches a page as markup, and every page forbids inline scripts and framing.
func TestUntrustedValuesEscaped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{})
	evil := `<script>alert(1)</script>"'><img src=x onerror=alert(2)>`
	ids := f.write(outbox.Event{AggregateType: "t" + evil, AggregateID: evil, Type: evil, Payload: []byte(`{"x":"` + strings.ReplaceAll(evil, `"`, `\"`) + `"}`),
		Headers: map[string]string{"h": evil}})
	f.kill(t, ids...)
	c := client(t)
	u := f.srv.URL + "/ui"
	for _, path := range []string{"/", "/relays", "/dead", "/events/" + ids[0], "/dead?aggregateid=" + url.QueryEscape(evil)} {
		code, body := get(t, c, u+path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Fatalf("%s renders the event's fields as markup", path)
		}
	}
	_, body := get(t, c, u+"/events/"+ids[0])
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatal("the aggregate id is not shown as text")
	}
	resp, err := c.Get(u + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("CSP = %q", csp)
	}
}

// TestBadInput: each bad request gets a clear answer and changes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{Token: "s3cret-admin-token"})
	ids := f.write(outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Placed", Payload: []byte(`{}`)})
	f.kill(t, ids...)
	c := client(t)
	u := f.srv.URL + "/ui"
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/dead?older=banana", http.StatusBadRequest, "want a duration"},
		{"/events/not-a-uuid", http.StatusNotFound, "No table holds an event"},
		{"/events/0195f0a0-0000-7000-8000-000000000000", http.StatusNotFound, "No table holds an event"},
		{"/events?id=", http.StatusBadRequest, "Give an event id"},
		{"/nope", http.StatusNotFound, "No such page"},
	} {
		if code, body := get(t, c, u+tc.path); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d, want %d with %q", tc.path, code, tc.code, tc.want)
		}
	}
	post(t, c, u+"/login", url.Values{"token": {"s3cret-admin-token"}})
	_, page := get(t, c, u+"/dead")
	csrf := csrfField.FindStringSubmatch(page)[1]
	for _, tc := range []struct {
		form url.Values
		want string
	}{
		{url.Values{"do": {"explode-selected"}}, "Unknown action"},
		{url.Values{"do": {"purge-selected"}}, "Select the dead letters"},
		{url.Values{"do": {"purge-matching"}, "older": {"-1h"}}, "want a duration"},
	} {
		tc.form.Set("csrf", csrf)
		if code, body := post(t, c, u+"/dead/action", tc.form); code != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("POST %v: %d, want 400 with %q", tc.form, code, tc.want)
		}
	}
	if st := f.state(t, ids[0]); st != outboxdriver.EventDead {
		t.Fatalf("event is %s after bad requests", st)
	}
}

// TestRelaysPage: two relays of a group show with their heartbeats and the 64
// partitions split between them, as the database records them.
func TestRelaysPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{})
	mem := memory.New(0)
	cfg := func(id string) *relay.Config {
		return &relay.Config{PollInterval: 50 * time.Millisecond, Group: &relay.GroupConfig{RelayID: id, LeaseTTL: 2 * time.Second}}
	}
	a := relaytest.Start(t, f.store, mem, cfg("relay-a"))
	// Each relay has its own pool, as each would have its own process.
	other, err := outboxpgx.New(testenv.Pool(t, testenv.DatabaseURL(t)), &f.table).Store()
	if err != nil {
		t.Fatal(err)
	}
	b := relaytest.Start(t, other, mem, cfg("relay-<b>"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	testenv.Wait(t, ctx, "both relays owning partitions", func() bool {
		return a.Stats().Partitions+b.Stats().Partitions >= 64 && a.Stats().Partitions > 0 && b.Stats().Partitions > 0
	})
	c := client(t)
	var body string
	testenv.WaitTell(t, ctx, "the relays page showing both members and 64 partitions", func() bool {
		_, body = get(t, c, f.srv.URL+"/ui/relays?partial=1")
		return strings.Contains(body, "relay-a") && strings.Contains(body, "relay-&lt;b&gt;") && strings.Count(body, `<span class="part`) == 64 &&
			!strings.Contains(body, "<html")
	}, func() string { return body })
}

// countingStatus counts the status reads of the real store it wraps (with none, the
// reads are only counted).
type countingStatus struct {
	outboxdriver.Store
	n atomic.Int64
}

func (c *countingStatus) Status(ctx context.Context) (*outboxdriver.Status, error) {
	c.n.Add(1)
	if c.Store == nil {
		return &outboxdriver.Status{}, nil
	}
	return c.Store.Status(ctx)
}

// TestSamplesOnlyWhileWatched: a relay whose dashboard nobody opens does not count
// its table for the charts; the first page starts the sampling.
func TestSamplesOnlyWhileWatched(t *testing.T) {
	t.Parallel()
	_, drv := testenv.Outbox(t)
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		cs := &countingStatus{} // no store behind it: reads are only counted
		d, err := dashboard.New(&dashboard.Config{Admin: store, Status: cs, SampleInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); d.Run(ctx) }()
		time.Sleep(200 * time.Millisecond) //nolint:forbidigo // 20 sample intervals with nobody watching, on the bubble's virtual clock (synctest)
		synctest.Wait()
		if n := cs.n.Load(); n != 0 {
			t.Fatalf("%d status reads with nobody watching", n)
		}
		cancel()
		<-done
	})
	cs := &countingStatus{Store: store}
	d, err := dashboard.New(&dashboard.Config{Admin: store, Status: cs, SampleInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	srv := httptest.NewServer(d)
	defer srv.Close()
	get(t, client(t), srv.URL+"/ui/relays")
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	testenv.Wait(t, wctx, "the status sampled once a page was served", func() bool { return cs.n.Load() >= 5 })
}

// TestHostAllowlist: the dashboard answers to IP addresses, localhost and the names it
// is given, and refuses any other Host (DNS rebinding: another site's name made to
// resolve to 127.0.0.1 cannot read it).
func TestHostAllowlist(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{Hosts: []string{"outbox.internal"}})
	for host, want := range map[string]int{
		"":                         http.StatusOK, // the server's own 127.0.0.1:port
		"localhost:9465":           http.StatusOK,
		"[::1]:9465":               http.StatusOK,
		"outbox.internal":          http.StatusOK,
		"OUTBOX.internal.:443":     http.StatusOK,
		"attacker.example":         http.StatusMisdirectedRequest,
		"attacker.example:9465":    http.StatusMisdirectedRequest,
		"outbox.internal.evil.com": http.StatusMisdirectedRequest,
	} {
		req, err := http.NewRequest("GET", f.srv.URL+"/ui/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestFieldsShownSafely: an aggregate id with a right-to-left override ("evil" +
// U+202E + "gnp.exe", which displays as "evilexe.png") is shown escaped on the
// dead-letter list and the event page, never as the raw rune.
func TestFieldsShownSafely(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{})
	ids := f.write(outbox.Event{AggregateType: "order", AggregateID: "evil\u202egnp.exe", Type: "T\u009b", Payload: []byte(`{}`)})
	f.kill(t, ids...)
	for _, path := range []string{"/ui/dead", "/ui/events/" + ids[0]} {
		resp, err := http.Get(f.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.ContainsAny(string(body), "\u202e\u009b") || !strings.Contains(string(body), `evil\u202egnp.exe`) {
			t.Fatalf("%s: %d; the raw override is on the page, or its escape is not:\n%s", path, resp.StatusCode, body)
		}
	}
}

// TestBigPayloadPage: an event with a 10 MB payload shows its first 64 KiB and a
// download link; the download is the whole payload, unrendered.
func TestBigPayloadPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{})
	big := []byte(`{"pad":"` + strings.Repeat("x", 10<<20) + `"}`)
	ids := f.write(outbox.Event{AggregateType: "order", AggregateID: "a", Type: "T", Payload: big})
	resp, err := http.Get(f.srv.URL + "/ui/events/" + ids[0])
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(page) > 200<<10 || !strings.Contains(string(page), "download the whole payload") {
		t.Fatalf("event page: %d, %d bytes; want a preview and a download link", resp.StatusCode, len(page))
	}
	resp, err = http.Get(f.srv.URL + "/ui/events/" + ids[0] + "/payload")
	if err != nil {
		t.Fatal(err)
	}
	whole, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(whole) < 10<<20 || resp.Header.Get("Content-Disposition") == "" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("download: %d, %d bytes, %q, Cache-Control %q", resp.StatusCode, len(whole), resp.Header.Get("Content-Disposition"), resp.Header.Get("Cache-Control"))
	}
}

// TestEditDeadLetter: an admin fixes a dead letter's payload and headers on its page,
// then saves and replays it; a bad form is refused with what was typed kept, and a
// read-only visitor gets no form and no edit.
func TestEditDeadLetter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, dashboard.Config{Token: "s3cret-admin-token"})
	ids := f.write(outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Placed", Payload: []byte(`{"n":"bad"}`),
		Headers: map[string]string{"tenant": "a", "stale": "x"}})
	f.kill(t, ids...)
	u := f.srv.URL + "/ui"
	edit := u + "/events/" + ids[0] + "/edit"
	c := client(t)
	if _, page := get(t, c, u+"/events/"+ids[0]); strings.Contains(page, `id="edit"`) {
		t.Fatal("a read-only visitor sees the edit form")
	}
	if code, _ := post(t, c, edit, url.Values{"payload": {`{"n":1}`}}); code != http.StatusForbidden {
		t.Fatalf("anonymous edit: %d", code)
	}
	if code, _ := post(t, c, u+"/login", url.Values{"token": {"s3cret-admin-token"}}); code != http.StatusSeeOther {
		t.Fatalf("sign in: %d", code)
	}
	_, page := get(t, c, u+"/events/"+ids[0])
	m := csrfField.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `id="edit"`) || !strings.Contains(page, `{&#34;n&#34;: &#34;bad&#34;}`) {
		t.Fatalf("no edit form with the payload for an admin:\n%s", page)
	}
	form := url.Values{"csrf": {m[1]}, "do": {"save"}, "payload": {`{"n":1}`}, "headers": {`{"tenant": "a", "fixed": "yes"`}}
	code, body := post(t, c, edit, form)
	if code != http.StatusBadRequest || !strings.Contains(body, "JSON object") || !strings.Contains(body, `{&#34;tenant&#34;: &#34;a&#34;, &#34;fixed&#34;: &#34;yes&#34;`) {
		t.Fatalf("bad headers: %d, want 400 with the typed text kept:\n%s", code, body)
	}
	form.Set("payload", "not json\r\n")
	form.Set("headers", `{"tenant": "a", "fixed": "yes"}`)
	if code, body := post(t, c, edit, form); code != http.StatusBadRequest || !strings.Contains(body, "not changed") || !strings.Contains(body, "not json") {
		t.Fatalf("a payload the jsonb column refuses: %d\n%s", code, body)
	}
	if e, _ := f.store.Event(context.Background(), ids[0]); string(e.Payload) != `{"n": "bad"}` || e.Headers["stale"] != "x" {
		t.Fatalf("a refused edit changed the dead letter: %s %v", e.Payload, e.Headers)
	}
	form.Set("payload", `{"n":1}`)
	form.Set("do", "save-replay")
	if code, body := post(t, c, edit, form); code != http.StatusSeeOther {
		t.Fatalf("save and replay: %d\n%s", code, body)
	}
	e, err := f.store.Event(context.Background(), ids[0])
	if err != nil || e.State != outboxdriver.EventWaiting || string(e.Payload) != `{"n": 1}` || e.Headers["fixed"] != "yes" || e.Headers["stale"] != "" {
		t.Fatalf("after save and replay: %+v, %v", e, err)
	}
	if _, page := get(t, c, u+"/events/"+ids[0]+"?done=replayed"); !strings.Contains(page, "Saved and replayed") {
		t.Fatal("no confirmation after the edit")
	}
	if code, _ := post(t, c, edit, form); code != http.StatusNotFound {
		t.Fatalf("editing an event that is no longer dead: %d", code)
	}
}

// TestReplayPage: an admin starts a replay from the dashboard with the command's
// options, watches it finish, and stops another midway; a refused form is shown
// again as typed; without the token nothing starts; a dashboard with no broker says
// where to replay.
func TestReplayPage(t *testing.T) {
	t.Parallel()
	b := memory.New(0)
	var rn *replay.Runner
	f := newFixtureWith(t, dashboard.Config{Token: "s3cret-admin-token"}, func(pool *pgxpool.Pool, table outboxdriver.Table, cfg *dashboard.Config) {
		rn = replay.NewRunner(replay.New(pool, table), b, nil)
		cfg.Replays = rn
	})
	t.Cleanup(func() { rn.Stop(context.Background()) })
	for i := range 30 {
		f.write(outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%3), Type: "Placed", Payload: []byte(`{}`)})
	}
	if _, err := f.pool.Exec(context.Background(), `UPDATE `+f.table.String()+` SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	u := f.srv.URL + "/ui"
	c := client(t)
	if _, page := get(t, c, u+"/replay"); strings.Contains(page, `id="replay-form"`) {
		t.Fatal("a read-only visitor sees the replay form")
	}
	if code, _ := post(t, c, u+"/replay/start", url.Values{"name": {"x"}}); code != http.StatusForbidden {
		t.Fatalf("anonymous start: %d", code)
	}
	if code, _ := post(t, c, u+"/login", url.Values{"token": {"s3cret-admin-token"}}); code != http.StatusSeeOther {
		t.Fatalf("sign in: %d", code)
	}
	_, page := get(t, c, u+"/replay")
	m := csrfField.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `id="replay-form"`) {
		t.Fatalf("no replay form for an admin:\n%s", page)
	}
	form := url.Values{"csrf": {m[1]}, "name": {"rebuild"}, "since": {"yesterday"}, "aggregateid": {"o-1"}}
	if code, body := post(t, c, u+"/replay/start", form); code != http.StatusBadRequest || !strings.Contains(body, "want RFC 3339") || !strings.Contains(body, `value="o-1"`) {
		t.Fatalf("a bad since: %d, want 400 with the form kept:\n%s", code, body)
	}
	form.Set("since", "1h")
	if code, _ := post(t, c, u+"/replay/start", form); code != http.StatusSeeOther {
		t.Fatalf("start: %d", code)
	}
	testenv.Wait(t, context.Background(), "the replay done", func() bool { return !rn.State().Running })
	if st := rn.State(); st.Err != nil || st.Result.Sent != 10 || len(b.Messages()) != 10 || b.Messages()[0].Headers["outbox-replay"] != "rebuild" {
		t.Fatalf("replay state %+v, %d messages", st, len(b.Messages()))
	}
	if _, page := get(t, c, u+"/replay"); !strings.Contains(page, "Done: 10 events sent") {
		t.Fatalf("no result on the page:\n%s", page)
	}
	// A slow one, stopped midway; its checkpoint stands.
	slow := url.Values{"csrf": {m[1]}, "name": {"slow"}, "rate": {"5"}}
	if code, _ := post(t, c, u+"/replay/start", slow); code != http.StatusSeeOther {
		t.Fatalf("start the slow one: %d", code)
	}
	if code, body := post(t, c, u+"/replay/start", slow); code != http.StatusConflict || !strings.Contains(body, "running") {
		t.Fatalf("a second replay while one runs: %d\n%s", code, body)
	}
	if code, _ := post(t, c, u+"/replay/stop", url.Values{"csrf": {m[1]}}); code != http.StatusSeeOther {
		t.Fatalf("stop: %d", code)
	}
	if st := rn.State(); st.Running || !st.Stopped || st.Err != nil {
		t.Fatalf("after stop: %+v", st)
	}
	if _, page := get(t, c, u+"/replay"); !strings.Contains(page, "Stopped after") {
		t.Fatalf("no stop on the page:\n%s", page)
	}
	// No broker, no replay: the page says where.
	g := newFixture(t, dashboard.Config{Token: "s3cret-admin-token"})
	if _, page := get(t, client(t), g.srv.URL+"/ui/replay"); !strings.Contains(page, `id="replay-unavailable"`) {
		t.Fatalf("a dashboard without a broker:\n%s", page)
	}
}

// countingAdmin is the real store, counting the whole-event reads in flight; each
// read waits for the test's go-ahead, so that the reads pile up if nothing bounds them.
type countingAdmin struct {
	outboxdriver.Admin
	mu            sync.Mutex
	inFlight, max int
	goAhead       chan struct{}
}

func (a *countingAdmin) Event(ctx context.Context, id string) (*outboxdriver.EventInfo, error) {
	a.mu.Lock()
	a.inFlight++
	a.max = max(a.max, a.inFlight)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inFlight--
		a.mu.Unlock()
	}()
	select {
	case <-a.goAhead:
	case <-ctx.Done():
	}
	return a.Admin.Event(ctx, id)
}

func (a *countingAdmin) now() (inFlight, most int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight, a.max
}

// TestEventReadsBounded: a big payload is read whole, so many views of big dead
// letters at once read at most two at a time (the memory they take is bounded in
// total); every view is still served.
func TestEventReadsBounded(t *testing.T) {
	t.Parallel()
	var admin *countingAdmin
	f := newFixtureWith(t, dashboard.Config{}, func(_ *pgxpool.Pool, _ outboxdriver.Table, cfg *dashboard.Config) {
		admin = &countingAdmin{Admin: cfg.Admin, goAhead: make(chan struct{})}
		cfg.Admin = admin
	})
	ids := f.write(outbox.Event{AggregateType: "order", AggregateID: "a", Type: "T", Payload: []byte(`{"pad":"` + strings.Repeat("x", 100<<10) + `"}`)})
	const views = 4 // each waits its turn within the dashboard's 10 s per request
	codes := make(chan int, views)
	for i := range views {
		path := "/ui/events/" + ids[0]
		if i%2 == 1 {
			path += "/payload"
		}
		go func() {
			resp, err := http.Get(f.srv.URL + path)
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for served := 0; served < views; served++ {
		testenv.WaitTell(t, ctx, "a read in flight", func() bool { n, _ := admin.now(); return n > 0 }, func() string { return "" })
		admin.goAhead <- struct{}{}
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("a view answered %d", code)
		}
	}
	if _, most := admin.now(); most > 2 {
		t.Fatalf("%d whole events read at once, want at most 2", most)
	}
}
