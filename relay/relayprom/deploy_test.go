package relayprom_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay/relayprom"
)

// TestDeployFilesUseRealMetrics: every outbox_* metric the Grafana dashboard and the
// alert rules in deploy/ query is one the relay exports, and the dashboard is JSON.
func TestDeployFilesUseRealMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := relayprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	retired, err := relayprom.NewRetiredTables(reg)
	if err != nil {
		t.Fatal(err)
	}
	retired.Retire("public.outbox")
	known := map[string]bool{}
	// Collected from the store at scrape time: named by the collector's descriptions.
	descs := make(chan *prometheus.Desc, 64)
	m.Describe(descs)
	close(descs)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if sm := fq.FindStringSubmatch(d.String()); sm != nil {
			known[sm[1]] = true
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		known[mf.GetName()] = true
	}
	// Vectors without observations are not gathered; name them from the package doc.
	for _, n := range []string{"outbox_relay_published_total", "outbox_relay_failed_total"} {
		known[n] = true
	}
	re := regexp.MustCompile(`outbox_[a-z_]+`)
	for _, f := range []string{"../../deploy/grafana-dashboard.json", "../../deploy/prometheus-alerts.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".json") {
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
		for _, name := range re.FindAllString(string(b), -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
			if !known[base] && !known[name] {
				t.Errorf("%s uses %s, which the relay does not export", f, name)
			}
		}
	}
}

// TestAlertRules: promtool (from Debian's prometheus package) checks the alert rules
// and runs their unit tests (deploy/prometheus-alerts.test.yml): the relay-gone alert
// fires when no relay serves outbox_relay_leader at all, which max() alone never saw.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Missing(t, "promtool (Debian's prometheus package): %v", err)
	}
	for _, args := range [][]string{
		{"check", "rules", "prometheus-alerts.yml"},
		{"test", "rules", "prometheus-alerts.test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../../deploy"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
