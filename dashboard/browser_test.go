package dashboard_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outbox"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/dashboard"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relayprom"
	"github.com/outboxd/outbox/relay/relaytest"
)

var screenshot = flag.String("screenshot", "", "write a PNG of the overview under load here (docs/dashboard.png)")

// chromium finds the browser: $CHROMIUM, or Debian's chromium on the PATH.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "Chromium for the browser tests (Debian: apt-get install chromium)")
	return ""
}

// browser starts a headless Chromium of the test's own, closed when it ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // as root on CI
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil { // the first run starts the browser: no timeout on it
		cancelBrowser()
		cancelAlloc()
		t.Fatalf("starting Chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancel(); cancelBrowser(); cancelAlloc() })
	return ctx
}

// TestBrowser drives the dashboard of a running relay (PostgreSQL, NATS) in headless
// Chromium, as an operator would: the overview's numbers move as events are written;
// an event the stream refuses becomes a dead letter whose aggregate id (a <script>)
// shows as text; replay is refused without the token; signed in, after the stream's
// limit is raised, the replay is delivered.
func TestBrowser(t *testing.T) {
	ctx := browser(t)
	_, drv := testenv.Outbox(t)
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	natsURL := natstest.URL(t)
	nc, err := natsgo.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream := testenv.UniqueName("UI")
	streamCfg := jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, MaxMsgSize: 2048, Storage: jetstream.MemoryStorage}
	if _, err := js.CreateStream(ctx, streamCfg); err != nil {
		t.Fatal(err)
	}
	defer natstest.DeleteStream(natsURL, stream)
	pub, err := natspub.Dial(ctx, natsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	// Wired as `outbox relay --http` wires it.
	reg := prometheus.NewRegistry()
	status := relayprom.NewStatusCache(store, time.Second)
	metrics, err := relayprom.New(reg, status)
	if err != nil {
		t.Fatal(err)
	}
	r := relaytest.Start(t, store, pub, &relay.Config{TopicTemplate: stream + ".${aggregatetype}", Hooks: metrics, PollInterval: 100 * time.Millisecond})
	d, err := dashboard.New(&dashboard.Config{Admin: store, Status: status, Metrics: reg, Relay: r, Table: drv.Table().String(),
		Mode: "poll", Broker: natsURL, Token: "s3cret-admin-token", SampleInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); d.Run(runCtx) }()
	defer func() { stopRun(); <-ran }()
	mux := http.NewServeMux()
	mux.Handle("/ui/", d)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ui := srv.URL + "/ui"

	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	write := func(evs ...outbox.Event) {
		t.Helper()
		if err := w.Write(ctx, evs...); err != nil {
			t.Fatal(err)
		}
	}
	readText := func(sel string) (string, error) {
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		return strings.TrimSpace(s), err
	}
	text := func(sel string) string {
		t.Helper()
		s, err := readText(sel)
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	// waitText reads sel until ok: the live part is replaced every 2 s, so a node
	// found and gone before its text was read is a moment to wait through, not a
	// failure.
	waitText := func(sel string, ok func(string) bool, what string) string {
		t.Helper()
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var s string
		var err error
		testenv.WaitTell(t, wctx, what, func() bool { s, err = readText(sel); return err == nil && ok(s) },
			func() string { return fmt.Sprintf("%s reads %q (%v)", sel, s, err) })
		return s
	}

	// The overview's numbers move as events are written, without a reload.
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/"), chromedp.WaitVisible(chromedp.CSS("#published"))); err != nil {
		t.Fatal(err)
	}
	waitText("#published", func(s string) bool { return s == "0" }, "published 0 before any event")
	waitText("#relay-role", func(s string) bool { return s == "active" }, "the relay's role")
	var evs []outbox.Event
	for i := range 200 {
		evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint("o-", i%20), Type: "Placed", Payload: []byte(`{"n":1}`)})
	}
	write(evs...)
	waitText("#published", func(s string) bool { return s == "200" }, "the live overview")
	waitText("#backlog", func(s string) bool { return s == "0" }, "the live overview")
	waitText("#rate", func(s string) bool { return s != "–" }, "the live overview")

	// An event the stream refuses (over its max_msg_size) becomes a dead letter; its
	// aggregate id is a script, shown as text.
	evil := `<script>window.pwned=1</script>`
	id := uuid.Must(uuid.NewV7()).String()
	write(outbox.Event{ID: id, AggregateType: "order", AggregateID: evil, Type: "Placed", Payload: []byte(`{"pad":"` + strings.Repeat("x", 4096) + `"}`)})
	testenv.Wait(t, ctx, "the oversized event a dead letter", func() bool {
		e, err := store.Event(ctx, id)
		return err == nil && e.State == outboxdriver.EventDead
	})
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/dead"), chromedp.WaitVisible(chromedp.CSS("#dead-table"))); err != nil {
		t.Fatal(err)
	}
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned !== undefined`))
	if err != nil {
		t.Fatal(err)
	}
	if got := text("#dead-table td.agg"); !strings.Contains(got, evil) || pwned {
		t.Fatalf("aggregate cell reads %q (script ran: %v); want the script as text", got, pwned)
	}

	// Without the token the replay is refused, and the event stays dead.
	box := fmt.Sprintf(`input[name="id"][value="%s"]`, id)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(box)), chromedp.Click(chromedp.CSS("#replay-selected")),
		chromedp.WaitVisible(chromedp.CSS("#message-title"))); err != nil {
		t.Fatal(err)
	}
	if got := text("#message-title"); got != "Refused" {
		t.Fatalf("replay without the token: page %q", got)
	}
	if e, _ := store.Event(ctx, id); e.State != outboxdriver.EventDead {
		t.Fatalf("after a refused replay the event is %s", e.State)
	}

	// Signed in, once the stream takes larger messages, the replay is delivered.
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/login"), chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "s3cret-admin-token"),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)), chromedp.WaitVisible(chromedp.CSS("#dead-table"))); err != nil {
		t.Fatal(err)
	}
	if got := text("#role"); got != "admin" {
		t.Fatalf("after signing in the role reads %q", got)
	}
	streamCfg.MaxMsgSize = 1 << 20
	if _, err := js.UpdateStream(ctx, streamCfg); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(box)), chromedp.Click(chromedp.CSS("#replay-selected")),
		chromedp.WaitVisible(chromedp.CSS("#flash"))); err != nil {
		t.Fatal(err)
	}
	if got := text("#flash"); !strings.Contains(got, "Replayed 1") {
		t.Fatalf("after the replay: %q", got)
	}
	msgs, err := natstest.Read(ctx, natsURL, stream, stream+".>", 201)
	if err != nil {
		t.Fatal(err)
	}
	if last := msgs[len(msgs)-1]; last.ID != id || last.Key != evil {
		t.Fatalf("last message on the stream: id %s key %q, want the replayed event", last.ID, last.Key)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/events/"+id), chromedp.WaitVisible(chromedp.CSS("#event-state"))); err != nil {
		t.Fatal(err)
	}
	waitText("#event-state", func(s string) bool { return s == "Published" }, "the event's story")
	if got := text("#aggregateid"); got != evil {
		t.Fatalf("event page aggregate id reads %q", got)
	}

	if *screenshot != "" {
		takeScreenshot(t, ctx, ui, write)
	}
}

// takeScreenshot writes a PNG of the overview after half a minute of steady load,
// for the README: go test ./dashboard -run TestBrowser -args -screenshot $PWD/docs/dashboard.png
func takeScreenshot(t *testing.T, ctx context.Context, ui string, write func(...outbox.Event)) {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for i := 0; time.Now().Before(end); i++ {
		var evs []outbox.Event
		for j := range 50 + (i%20)*10 {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint("o-", j%40), Type: "Placed", Payload: []byte(`{"total":42}`)})
		}
		write(evs...)
		time.Sleep(100 * time.Millisecond) //nolint:forbidigo // paces the steady load of the README's screenshot (run by hand)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/"), chromedp.WaitVisible(chromedp.CSS("#published")), chromedp.Sleep(time.Second)); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", *screenshot)
}
