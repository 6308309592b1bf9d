package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// objects are the manifests' documents, decoded strictly (an unknown field is an
// error): what the cluster's API server would take.
type objects struct {
	deployments []*appsv1.Deployment
	pdbs        []*policyv1.PodDisruptionBudget
	services    []*corev1.Service
	monitors    []*monitoringv1.ServiceMonitor
	jobs        []*batchv1.Job
	secrets     []*corev1.Secret
}

func load(t *testing.T) *objects {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var o objects
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
			var meta struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			var into any
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				d := &appsv1.Deployment{}
				o.deployments, into = append(o.deployments, d), d
			case "policy/v1 PodDisruptionBudget":
				p := &policyv1.PodDisruptionBudget{}
				o.pdbs, into = append(o.pdbs, p), p
			case "v1 Service":
				s := &corev1.Service{}
				o.services, into = append(o.services, s), s
			case "monitoring.coreos.com/v1 ServiceMonitor":
				m := &monitoringv1.ServiceMonitor{}
				o.monitors, into = append(o.monitors, m), m
			case "batch/v1 Job":
				j := &batchv1.Job{}
				o.jobs, into = append(o.jobs, j), j
			case "v1 Secret":
				s := &corev1.Secret{}
				o.secrets, into = append(o.secrets, s), s
			default:
				t.Fatalf("%s #%d: %s %s is not a kind this test knows", f, i, meta.APIVersion, meta.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, into); err != nil {
				t.Fatalf("%s #%d (%s): %v", f, i, meta.Kind, err)
			}
		}
	}
	return &o
}

// TestManifests: the relay runs as two replicas, probed on /healthz and /readyz, as a
// non-root user on a read-only root filesystem with every capability dropped, with
// resources, its secrets as files, a disruption budget, a metrics Service a
// ServiceMonitor scrapes, and a migrate Job.
func TestManifests(t *testing.T) {
	o := load(t)
	if len(o.deployments) != 1 || len(o.pdbs) != 1 || len(o.services) != 1 || len(o.monitors) != 1 || len(o.jobs) != 1 {
		t.Fatalf("want one each of Deployment, PodDisruptionBudget, Service, ServiceMonitor, Job: %d %d %d %d %d",
			len(o.deployments), len(o.pdbs), len(o.services), len(o.monitors), len(o.jobs))
	}
	d := o.deployments[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Error("the relay Deployment wants 2 replicas (active and standby)")
	}
	labels := d.Spec.Template.Labels
	for k, v := range d.Spec.Selector.MatchLabels {
		if labels[k] != v {
			t.Errorf("the Deployment's selector %s=%s does not match its pods", k, v)
		}
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("probes: liveness on /healthz, readiness on /readyz")
	}
	pods := []corev1.PodSpec{d.Spec.Template.Spec, o.jobs[0].Spec.Template.Spec}
	for _, pod := range pods {
		checkPod(t, pod)
	}
	if len(c.Args) == 0 || c.Args[0] != "relay" || o.jobs[0].Spec.Template.Spec.Containers[0].Args[0] != "migrate" {
		t.Error("the Deployment runs relay, the Job migrate")
	}
	for k, v := range o.pdbs[0].Spec.Selector.MatchLabels {
		if labels[k] != v {
			t.Error("the PodDisruptionBudget does not select the relay's pods")
		}
	}
	svc := o.services[0]
	for k, v := range svc.Spec.Selector {
		if labels[k] != v {
			t.Error("the metrics Service does not select the relay's pods")
		}
	}
	mon := o.monitors[0]
	for k, v := range mon.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Error("the ServiceMonitor does not select the metrics Service")
		}
	}
	if len(mon.Spec.Endpoints) != 1 || mon.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name {
		t.Error("the ServiceMonitor scrapes another port than the Service's")
	}
}

// checkPod: non-root, no privilege escalation, read-only root, no capabilities,
// resources, secrets mounted read-only and named by OUTBOX_*_FILE.
var releasedImage = regexp.MustCompile(`^ghcr\.io/outboxd/outbox:v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)

func checkPod(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Error("the pod must run as non-root")
	}
	for _, c := range pod.Containers {
		// A release's image, which `go run ./internal/release` writes here: a tag
		// such as latest moves under a running Deployment.
		if !releasedImage.MatchString(c.Image) {
			t.Errorf("container %s: image %q, want ghcr.io/outboxd/outbox:vX.Y.Z", c.Name, c.Image)
		}
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil ||
			*sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("container %s: read-only root, no privilege escalation, every capability dropped", c.Name)
		}
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("container %s: memory requests and limits", c.Name)
		}
		var mounted []string
		for _, m := range c.VolumeMounts {
			if !m.ReadOnly {
				t.Errorf("container %s: mount %s must be read-only", c.Name, m.Name)
			}
			mounted = append(mounted, m.MountPath+"/")
		}
		for _, e := range c.Env {
			if strings.HasSuffix(e.Name, "_FILE") {
				inside := false
				for _, p := range mounted {
					inside = inside || strings.HasPrefix(e.Value, p)
				}
				if !inside {
					t.Errorf("container %s: %s=%s is not in a mounted secret", c.Name, e.Name, e.Value)
				}
			}
		}
	}
}

// TestManifestFlags: every flag and OUTBOX_* variable a manifest names is one the
// binary has (outbox help CMD lists them), so a renamed flag cannot leave the
// manifests starting a relay that refuses its arguments.
func TestManifestFlags(t *testing.T) {
	o := load(t)
	var containers []corev1.Container
	for _, d := range o.deployments {
		containers = append(containers, d.Spec.Template.Spec.Containers...)
	}
	for _, j := range o.jobs {
		containers = append(containers, j.Spec.Template.Spec.Containers...)
	}
	flagsOf := map[string]map[string]bool{}
	flagLine := regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`)
	for _, c := range containers {
		cmd := c.Args[0]
		if flagsOf[cmd] == nil {
			out, err := exec.Command("go", "run", "-C", "../..", "./cmd/outbox", "help", cmd).CombinedOutput()
			if err != nil && !bytes.Contains(out, []byte("Usage of outbox "+cmd)) {
				t.Fatalf("outbox help %s: %v\n%s", cmd, err, out)
			}
			flagsOf[cmd] = map[string]bool{}
			for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
				flagsOf[cmd][m[1]] = true
			}
		}
		for _, a := range c.Args[1:] {
			if name, ok := strings.CutPrefix(a, "--"); ok && !flagsOf[cmd][strings.SplitN(name, "=", 2)[0]] {
				t.Errorf("%s: outbox %s has no flag %s", c.Name, cmd, a)
			}
		}
		for _, e := range c.Env {
			name, ok := strings.CutPrefix(e.Name, "OUTBOX_")
			if !ok {
				continue
			}
			flag := strings.ToLower(strings.ReplaceAll(strings.TrimSuffix(name, "_FILE"), "_", "-"))
			if !flagsOf[cmd][flag] {
				t.Errorf("%s: %s names no flag of outbox %s (--%s)", c.Name, e.Name, cmd, flag)
			}
		}
	}
	if len(flagsOf["relay"]) < 20 {
		t.Fatalf("read only %d relay flags: %s", len(flagsOf["relay"]), fmt.Sprint(flagsOf["relay"]))
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
