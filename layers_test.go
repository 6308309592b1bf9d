package outbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependenciesPointOneWay: what a service that only writes events links holds no
// replication client, no broker client and no server; no driver imports the CDC
// source built on it.
func TestDependenciesPointOneWay(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command("go", "list", "-deps", ".", "./outboxdriver/outboxpgx", "./outboxdriver/outboxsql").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"pglogrepl", "/pgcdc", "/broker/", "nats-io", "franz-go", "amqp091", "go-redis", "paho", "nats-server"} {
			if strings.Contains(dep, banned) {
				t.Errorf("a writer links %s", dep)
			}
		}
	}
	out, err = exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", "./outboxdriver/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.Contains(line, "/pgcdc") {
			t.Errorf("a driver package imports the CDC source: %s", line)
		}
	}
}
