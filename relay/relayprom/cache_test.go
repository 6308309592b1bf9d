package relayprom_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay/relayprom"
)

// countedStatus counts the status queries that reach the database.
type countedStatus struct {
	relayprom.StatusReader
	n atomic.Int64
}

func (c *countedStatus) Status(ctx context.Context) (*outboxdriver.Status, error) {
	c.n.Add(1)
	return c.StatusReader.Status(ctx)
}

// TestScrapesShareOneStatusQuery: 100 concurrent /metrics requests cause one status
// query on the real table per refresh interval, not one each.
func TestScrapesShareOneStatusQuery(t *testing.T) {
	_, drv := testenv.Outbox(t)
	store, _ := drv.Store()
	db := &countedStatus{StatusReader: store}
	reg := prometheus.NewRegistry()
	if _, err := relayprom.New(reg, relayprom.NewStatusCache(db, time.Minute)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}()
	}
	wg.Wait()
	srv.Client().CloseIdleConnections()
	if n := db.n.Load(); n != 1 {
		t.Fatalf("100 concurrent scrapes ran %d status queries, want 1 per interval", n)
	}
}
