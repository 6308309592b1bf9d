package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestShedListener: at the bound, a new connection (a health probe) is served, and
// the oldest connection that sent nothing is closed to make room, instead of the probe
// waiting for a slot until the server's header timeout frees one.
func TestShedListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	shed := newShedListener(ln, 3)
	srv := &http.Server{ReadHeaderTimeout: time.Hour, ConnState: shed.state,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(shed) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })

	// Three silent connections fill the bound (a flood that never sends a header).
	var silent []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		silent = append(silent, c)
	}
	// A probe is answered, though the server waits an hour for silent headers.
	probe, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = probe.Close() }()
	_ = probe.SetDeadline(time.Now().Add(30 * time.Second)) // a safety net: the fault is a probe never answered
	if _, err := io.WriteString(probe, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	status, err := bufio.NewReader(probe).ReadString('\n')
	if err != nil || !strings.Contains(status, "200") {
		t.Fatalf("probe: %q, %v", status, err)
	}
	// The oldest silent connection was closed to make room for it.
	if _, err := silent[0].Read(make([]byte, 1)); err == nil {
		t.Fatal("the oldest silent connection was not closed")
	}
}
