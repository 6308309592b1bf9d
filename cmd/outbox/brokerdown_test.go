package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/internal/testenv"
)

// TestRelayWaitsForItsBroker: a relay started while its broker is down does not
// exit (a crash loop under a supervisor): it starts, says so without the broker's
// password, answers /healthz, is not ready, and publishes what was written once the
// broker is up, then is ready.
func TestRelayWaitsForItsBroker(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	ns, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	natsURL := strings.Replace(ns.URL(), "nats://", "nats://u:hunter2@", 1)
	ns.Stop() // down before the relay starts; Restart brings it back on the same port
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := startRelayProc(t, nil, "--db", url, "--table", table.Schema+"."+table.Name, "--broker", natsURL,
		"--nats-create-stream", "--http", addr, "--poll-interval", "50ms")
	ctx := context.Background()
	testenv.Wait(t, ctx, "the relay to serve /healthz", func() bool { return httpBody(addr, "/healthz") == "ok\n" })
	if body := httpBody(addr, "/readyz"); !strings.Contains(body, "broker") {
		t.Fatalf("/readyz with the broker down: %q, want not ready for the broker", body)
	}
	want := writeEvents(t, pool, table, 2, 10)
	if err := ns.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	testenv.Wait(t, ctx, "the relay ready once the broker is up", func() bool { return strings.HasPrefix(httpBody(addr, "/readyz"), "ready") })
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	got, err := natstest.Read(rctx, ns.URL(), "OUTBOX", ">", 10)
	if err != nil {
		t.Fatal(err)
	}
	checkOrder(t, want, got)
	if out := p.output(); !strings.Contains(out, "the broker does not answer; starting anyway") || strings.Contains(out, "hunter2") {
		t.Fatalf("relay output: want the start warning and no password:\n%s", out)
	}
}
