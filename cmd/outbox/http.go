package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relayprom"
)

// serveHTTP serves /metrics, /healthz and /readyz on addr until ctx ends.
//
//	/healthz  200 while the process runs
//	/readyz   200 when the database answers and the broker is not known to be down
//
// Both read the table's status through status (a cache: probes stay cheap).
func serveHTTP(ctx context.Context, addr string, reg *prometheus.Registry, status relayprom.StatusReader, r *relay.Relay, log *slog.Logger) (func(), error) {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), 3*time.Second)
		defer cancel()
		if _, err := status.Status(ctx); err != nil {
			http.Error(w, "database: "+redact.String(err.Error()), http.StatusServiceUnavailable)
			return
		}
		st := r.Stats()
		if !st.BrokerDownSince.IsZero() {
			http.Error(w, "broker unavailable since "+st.BrokerDownSince.UTC().Format(time.RFC3339), http.StatusServiceUnavailable)
			return
		}
		role := "standby"
		if st.Leader {
			role = "active"
		}
		fmt.Fprintf(w, "ready (%s)\n", role)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, usageErr("--http %s: %v", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}
