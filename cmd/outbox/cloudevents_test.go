package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/outboxd/outbox/internal/testenv"
)

// TestCloudEventsWebhook: `outbox relay --format cloudevents` to a webhook, read by
// the CloudEvents Go SDK's own HTTP binding, in binary and structured mode: every
// event arrives valid, with the attributes docs/cloudevents.md maps from the row, in
// order per aggregate.
func TestCloudEventsWebhook(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			url := testenv.DatabaseURL(t)
			pool := testenv.Pool(t, url)
			table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
			var mu sync.Mutex
			var got []event.Event
			var refused []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ev, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
				if err == nil {
					err = ev.Validate()
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					refused = append(refused, err.Error())
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				got = append(got, *ev)
				w.WriteHeader(http.StatusNoContent)
			}))
			defer srv.Close()
			want := writeEvents(t, pool, table, 3, 30)
			p := startRelayProc(t, nil, "--db", url, "--table", table.Schema+".outbox", "--broker", srv.URL+"/events",
				"--webhook-secret", "whsec_aHVudGVyMmh1bnRlcjI=", "--format", "cloudevents", "--cloudevents-mode", mode)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			testenv.WaitTell(t, ctx, "30 CloudEvents", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got)+len(refused) >= 30
			}, p.output)
			mu.Lock()
			defer mu.Unlock()
			if len(refused) > 0 {
				t.Fatalf("the SDK refused %d events: %v", len(refused), refused[0])
			}
			next := map[string]int{}
			for _, ev := range got {
				agg := ev.Subject()
				ids := want[agg]
				if n := next[agg]; n >= len(ids) || ev.ID() != ids[n] {
					t.Fatalf("event %s of aggregate %q out of order or unknown (want %v)", ev.ID(), agg, ids)
				}
				next[agg]++
				ext := ev.Extensions()
				if ev.Source() != "/outbox/"+table.Schema+".outbox" || ev.Type() == "" || ev.Time().IsZero() ||
					ev.DataContentType() != "application/json" || fmt.Sprint(ext["partitionkey"]) != agg ||
					fmt.Sprint(ext["aggregatetype"]) == "" || fmt.Sprint(ext["sequence"]) == "" || !json.Valid(ev.Data()) {
					t.Fatalf("event %s: attributes %s", ev.ID(), ev.String())
				}
			}
		})
	}
}
