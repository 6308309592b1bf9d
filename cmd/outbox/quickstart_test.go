package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/internal/testenv"
)

// TestQuickstart runs the README's "Running the relay" commands as written, so the
// door stays true: the database URL becomes the test's (with a schema of its own),
// the NATS URL an embedded server's; `go build` is this test binary's build, a line
// ending in & runs in the background, and `outbox ui` is started and asked for its
// page.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "## Running the relay\n\n```sh\n")
	if !ok {
		t.Fatal("README.md has no 'Running the relay' block")
	}
	block, _, _ = strings.Cut(block, "```")
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	ns, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	const dbWritten, natsWritten = "postgres://app@db:5432/app", "nats://nats:4222"
	ran := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		line, _, _ = strings.Cut(line, "#")
		line = strings.TrimSpace(line)
		background := strings.HasSuffix(line, "&")
		args := strings.Fields(strings.TrimSuffix(line, "&"))
		if len(args) == 0 || args[0] == "go" {
			continue // go build: the test's binary is built already
		}
		if args[0] != "./outbox" {
			t.Fatalf("README quickstart line %q: not an outbox command", line)
		}
		args = args[1:]
		for i := 0; i < len(args); i++ {
			switch args[i] {
			case dbWritten:
				args = append(args[:i+1], append([]string{"--table", schema + ".outbox"}, args[i+1:]...)...)
				args[i] = url
			case natsWritten:
				args[i] = ns.URL()
			}
		}
		ran[args[0]] = true
		switch {
		case background:
			p := startRelayProc(t, nil, append(args[1:], "--http", "")...)
			testenv.WaitTell(t, context.Background(), "the relay active", func() bool {
				return strings.Contains(p.output(), "relay: active")
			}, p.output)
		case args[0] == "ui":
			addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int, 1)
			go func() { done <- run(ctx, append(args, "--listen", addr), io.Discard, io.Discard) }()
			testenv.Wait(t, context.Background(), "outbox ui serving /ui/", func() bool {
				resp, err := http.Get("http://" + addr + "/ui/")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			})
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("outbox ui did not stop")
			}
		default:
			stdout, stderr, code := runCLI(t, nil, args...)
			if code != 0 {
				t.Fatalf("outbox %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
			}
		}
	}
	for _, cmd := range []string{"migrate", "relay", "status", "verify", "ui", "version"} {
		if !ran[cmd] {
			t.Errorf("the quickstart no longer runs %q (or this test no longer finds it)", cmd)
		}
	}
}
