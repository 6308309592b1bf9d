package main

import (
	"io"
	"testing"

	"github.com/outboxd/outbox/relay"
)

// TestZeroTurnsOff: on the command line, 0 turns off what can be off and never means
// the library's default (which is what a zero means in a Go config).
func TestZeroTurnsOff(t *testing.T) {
	o, err := parseRelayFlags([]string{"--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--tables", "*.outbox", "--mode", "cdc",
		"--max-batch-bytes", "0", "--max-pending-bytes", "0", "--park-after", "0", "--max-spilled", "0", "--retention", "0", "--straggler-after", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]int64{
		"--max-batch-bytes": int64(o.cfg.MaxBatchBytes), "--max-pending-bytes": int64(o.cdc.MaxPendingBytes),
		"--park-after": int64(o.parkAfter), "--max-spilled": int64(o.maxSpilled), "--retention": int64(o.cfg.Retention), "--straggler-after": int64(o.cfg.StragglerAfter),
	} {
		if v >= 0 {
			t.Errorf("%s 0 became %d for the library, want a negative value (off)", name, v)
		}
	}
	o, err = parseRelayFlags([]string{"--db", "postgres://u@127.0.0.1:1/x", "--broker", "stdout:", "--max-batch-bytes", "-1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.MaxBatchBytes >= 0 {
		t.Errorf("--max-batch-bytes -1 (the earlier spelling of no bound) became %d", o.cfg.MaxBatchBytes)
	}
	if o.cfg.Retention != relay.RetentionDefault {
		t.Errorf("--retention left out became %v, want its default %v", o.cfg.Retention, relay.RetentionDefault)
	}
}
