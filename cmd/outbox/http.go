package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// sampler is a dashboard, which samples for its charts while it is watched.
type sampler interface{ Run(ctx context.Context) }

// maxHTTPConns bounds the connections the HTTP listener holds open at once.
const maxHTTPConns = 128

// listenAndServe serves h on addr, and samples for the dashboard if there is one,
// until the returned func is called (or ctx ends).
func listenAndServe(ctx context.Context, addr string, h http.Handler, dash sampler, what string, log *slog.Logger) (func(), error) {
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, usageErr("cannot listen on %s: %v", addr, err)
	}
	// Bounded: a client that idles, trickles a body or opens connection after
	// connection must not hold the descriptors the database and the broker need, nor
	// keep a health probe out.
	shed := newShedListener(ln, maxHTTPConns)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 64 << 10, ConnState: shed.state}
	ln = shed
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	if dash != nil {
		wg.Add(1)
		go func() { defer wg.Done(); dash.Run(ctx) }()
	}
	log.Info("serving "+what, "addr", ln.Addr().String())
	return func() {
		cancel()
		sctx, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancelShutdown()
		_ = srv.Shutdown(sctx)
		wg.Wait()
	}, nil
}

// shedListener holds at most max connections open. At the bound, accepting one more
// closes the oldest connection that is serving no request (one that connected and
// has not sent its headers, or one idling between requests) instead of waiting for a
// slot: a flood of silent connections cannot keep a health probe out for the server's
// header timeout at a time. With every connection serving a request, the new one is
// closed. state is the http.Server's ConnState hook that tells them apart.
type shedListener struct {
	net.Listener
	max int

	mu    sync.Mutex
	conns map[net.Conn]*shedConn // accepted and not closed
	seq   uint64
}

type shedConn struct {
	seq  uint64 // accept order
	busy bool   // serving a request
}

func newShedListener(ln net.Listener, max int) *shedListener {
	return &shedListener{Listener: ln, max: max, conns: map[net.Conn]*shedConn{}}
}

// Accept implements net.Listener.
func (l *shedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		var victim net.Conn
		if len(l.conns) >= l.max {
			var oldest uint64
			for vc, info := range l.conns {
				if !info.busy && (victim == nil || info.seq < oldest) {
					victim, oldest = vc, info.seq
				}
			}
			if victim == nil { // every connection serves a request: shed the new one
				l.mu.Unlock()
				_ = c.Close()
				continue
			}
			delete(l.conns, victim)
		}
		l.seq++
		l.conns[c] = &shedConn{seq: l.seq}
		l.mu.Unlock()
		if victim != nil {
			_ = victim.Close()
		}
		return c, nil
	}
}

func (l *shedListener) state(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateActive, http.StateIdle:
		if info := l.conns[c]; info != nil {
			info.busy = s == http.StateActive
		}
	case http.StateClosed, http.StateHijacked:
		delete(l.conns, c)
	}
}
