package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildah runs buildah on the vfs storage driver (no overlay mounts needed).
func buildah(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("buildah", append([]string{"--storage-driver", "vfs"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("buildah %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestImage builds the image with build.sh, as at a release's tag, and proves it
// complete: it says the release's version (label and `outbox version`), its user is not
// root, its entrypoint is the binary, it has the CA certificates and no shell, and
// its entrypoint, run as its user in a chroot of the unpacked image (this machine
// refuses a container runtime's cgroup setup), migrates a table and relays events
// from PostgreSQL to NATS.
func TestImage(t *testing.T) {
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("needs Linux and root (chroot, buildah's storage)")
	}
	if _, err := exec.LookPath("buildah"); err != nil {
		testenv.Missing(t, "buildah (Debian's buildah package): %v", err)
	}
	url, natsURL := testenv.DatabaseURL(t), natstest.URL(t)
	tag := "localhost/" + testenv.UniqueName("outbox-image-test-") + ":test"
	// A release's version, as build.sh finds it at a release's tag.
	const version = "v0.0.0-imagetest"
	build := exec.Command("./build.sh", tag)
	build.Env = append(os.Environ(), "BUILDAH_OPTS=--storage-driver vfs", "VERSION="+version)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("buildah", "--storage-driver", "vfs", "rmi", "-f", tag).Run() })

	cfg := buildah(t, "inspect", "--format", "{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.Cmd}}", tag)
	if cfg != "65532:65532 [/usr/local/bin/outbox] [relay]" {
		t.Fatalf("image config: %s", cfg)
	}
	// Its OCI labels say what it is built from.
	want := "unknown"
	if out, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		want = strings.TrimSpace(string(out))
	}
	if rev := buildah(t, "inspect", "--format", `{{index .OCIv1.Config.Labels "org.opencontainers.image.revision"}}`, tag); rev != want {
		t.Errorf("label org.opencontainers.image.revision = %q, want %q", rev, want)
	}
	if v := buildah(t, "inspect", "--format", `{{index .OCIv1.Config.Labels "org.opencontainers.image.version"}}`, tag); v != version {
		t.Errorf("label org.opencontainers.image.version = %q, want %q", v, version)
	}
	if src := buildah(t, "inspect", "--format", `{{index .OCIv1.Config.Labels "org.opencontainers.image.source"}}`, tag); src != "https://github.com/outboxd/outbox" {
		t.Errorf("label org.opencontainers.image.source = %q", src)
	}
	ctr := buildah(t, "from", "--name", strings.NewReplacer("localhost/", "", ":", "-").Replace(tag), tag)
	t.Cleanup(func() { _ = exec.Command("buildah", "--storage-driver", "vfs", "rm", ctr).Run() })
	root := buildah(t, "mount", ctr)
	if _, err := os.Stat(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")); err != nil {
		t.Fatalf("no CA certificates: %v", err)
	}
	for _, sh := range []string{"bin/sh", "usr/bin/sh", "bin/bash"} {
		if _, err := os.Stat(filepath.Join(root, sh)); err == nil {
			t.Fatalf("the image has a shell: /%s", sh)
		}
	}

	// The entrypoint, as the image's user.
	entry := func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "chroot", append([]string{"--userspec=65532:65532", root, "/usr/local/bin/outbox"}, args...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if out, err := entry(ctx, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "outbox "+version+" ") {
		t.Fatalf("outbox version in the image: %v\n%s", err, out)
	}
	// The demo, as `podman run --tmpfs /tmp IMAGE demo` runs it (the README's door
	// past the first run's compile): a writable /tmp, and /proc and /dev/null, which a
	// container runtime provides and a chroot does not.
	for _, dir := range []string{"tmp", "proc", "dev"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mknod", "-m", "666", filepath.Join(root, "dev", "null"), "c", "1", "3").CombinedOutput(); err != nil {
		t.Fatalf("mknod /dev/null in the image's root: %v\n%s", err, out)
	}
	if out, err := exec.Command("mount", "-t", "proc", "proc", filepath.Join(root, "proc")).CombinedOutput(); err != nil {
		t.Fatalf("mount /proc in the image's root: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "--lazy", filepath.Join(root, "proc")).Run() })
	if out, err := entry(ctx, "demo", "--duration", "2s", "--rate", "100").CombinedOutput(); err != nil || !strings.Contains(string(out), "lost 0 [ok]") {
		t.Fatalf("outbox demo in the image: %v\n%s", err, out)
	}

	schema := testenv.Schema(t, url)
	table := schema + ".outbox"
	if out, err := entry(ctx, "migrate", "--db", url, "--table", table).CombinedOutput(); err != nil {
		t.Fatalf("outbox migrate in the image: %v\n%s", err, out)
	}

	// A stream of the test's own, and events to relay into it.
	stream, prefix := testenv.UniqueName("IMAGE_"), testenv.UniqueName("image_")
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { natstest.DeleteStream(natsURL, stream) })
	pool := testenv.Pool(t, url)
	w, err := outbox.NewWriter(outboxpgx.New(pool, &outboxdriver.Table{Schema: schema, Name: "outbox"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i % 4), Type: "OrderPlaced", Payload: []byte(`{}`)}
	}
	if err := w.Write(ctx, evs...); err != nil {
		t.Fatal(err)
	}

	relay := entry(ctx, "relay", "--db", url, "--table", table, "--broker", natsURL,
		"--topic-template", prefix+".${aggregatetype}", "--http", "")
	var out strings.Builder
	relay.Stdout, relay.Stderr = &out, &out
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = relay.Process.Kill(); _ = relay.Wait() }()
	msgs, err := natstest.Read(ctx, natsURL, stream, prefix+".order", n)
	if err != nil {
		t.Fatalf("the image's relay: %v\n%s", err, out.String())
	}
	for i, m := range msgs {
		if m.ID != evs[i].ID {
			t.Fatalf("message %d is %s, want %s (in write order)", i, m.ID, evs[i].ID)
		}
	}
}
