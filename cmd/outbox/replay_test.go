package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/outboxd/outbox/internal/testenv"
)

// TestReplayCommand: `outbox status` says how far back history reaches, `outbox
// replay --dry-run` counts per topic, and `outbox replay` sends the selected events
// again, in order per aggregate, marked with outbox-replay.
func TestReplayCommand(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	want := writeEvents(t, pool, table, 3, 30)
	// Published, as a relay in mark completion leaves them.
	if _, err := pool.Exec(context.Background(), `UPDATE `+table.Schema+`.outbox SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	name := table.Schema + ".outbox"
	if out, stderr, code := runCLI(t, nil, "status", "--db", url, "--table", name); code != 0 || !strings.Contains(out, "history (replay):      back to ") {
		t.Fatalf("status: exit %d\n%s%s", code, out, stderr)
	}
	out, stderr, code := runCLI(t, nil, "replay", "--db", url, "--table", name, "--dry-run")
	if code != 0 || !strings.Contains(out, "outbox.event.order\t30") || !strings.Contains(out, "would send 30 events (all)") {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, stderr)
	}
	// The binary itself: the stdout publisher writes to the process's stdout.
	b, err := exec.Command(binary, "replay", "--db", url, "--table", name, "--broker", "stdout:", "--name", "cli", "--aggregate-id", "agg-1", "--rate", "1000").Output()
	out = string(b)
	if err != nil || !strings.Contains(out, "replay cli: sent 10 events (aggregateid=agg-1)") {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	var ids []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var m struct {
			ID      string            `json:"id"`
			Headers map[string]string `json:"headers"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m.Headers["outbox-replay"] != "cli" {
			t.Fatalf("replayed %s without its outbox-replay header: %v", m.ID, m.Headers)
		}
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != strings.Join(want["agg-1"], ",") {
		t.Fatalf("replayed %v, want agg-1's events in order %v", ids, want["agg-1"])
	}
}
