package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/mod/modfile"

	"github.com/outboxd/outbox/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// repoRoot is the checkout this test runs in.
const repoRoot = "../.."

func TestCutChangelog(t *testing.T) {
	const head = "# Changelog\n\nIntro.\n\n"
	got, err := cutChangelog(head+"## Unreleased\n\n### Fixed\n- a bug\n\n## v0.1.0 (2026-01-02)\n- first\n", "v0.2.0", "2026-12-06")
	if err != nil {
		t.Fatal(err)
	}
	want := head + "## Unreleased\n\n## v0.2.0 (2026-12-06)\n\n### Fixed\n- a bug\n\n## v0.1.0 (2026-01-02)\n- first\n"
	if got != want {
		t.Errorf("cut:\n%s\nwant:\n%s", got, want)
	}
	if _, err := cutChangelog(got, "v0.3.0", "2026-12-07"); !errors.Is(err, errNothingToRelease) {
		t.Errorf("empty Unreleased: %v, want errNothingToRelease", err)
	}
	if _, err := cutChangelog(head+"## Unreleased\n- x\n\n## v0.1.0 (2026-01-02)\n", "v0.1.0", "2026-12-07"); err == nil || !strings.Contains(err.Error(), "already has a section") {
		t.Errorf("a version twice: %v", err)
	}
	if _, err := cutChangelog(head, "v0.1.0", "2026-12-07"); err == nil {
		t.Error("no Unreleased heading: no error")
	}
}

func TestCheckVersion(t *testing.T) {
	for v, ok := range map[string]bool{
		"v0.2.0": true, "v1.0.0-rc.1": true, "v1.2.3": true,
		"0.2.0": false, "v0.2": false, "v1.0.0+meta": false, "v2.0.0": false, "": false,
	} {
		if err := checkVersion(v); (err == nil) != ok {
			t.Errorf("checkVersion(%q) = %v", v, err)
		}
	}
}

// TestModules: the release's modules come each after those it requires, the CLI and
// the libraries are released, and what exists for this repository alone is not.
func TestModules(t *testing.T) {
	mods, err := loadModules(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	released := map[string]bool{}
	for _, m := range mods {
		for _, r := range m.Requires {
			if !seen[r] {
				t.Errorf("%s comes before %s, which it requires", m.Path, r)
			}
		}
		seen[m.Path] = true
		released[m.Dir] = m.Released
	}
	for _, dir := range []string{".", "relay", "pgcdc", "cmd/outbox", "broker/nats", "inbox/kafkainbox", "internal/natsembed", "broker/brokertest"} {
		if !released[dir] {
			t.Errorf("%s is not released", dir)
		}
	}
	for _, dir := range unreleased {
		if released[dir] {
			t.Errorf("%s is released", dir)
		}
	}
}

// TestSetVersions: a released go.mod requires the repository's modules at the
// version and has no replace directive left (nor the comment above them); an
// unreleased one keeps its replace directives.
func TestSetVersions(t *testing.T) {
	tree := t.TempDir()
	mods, err := loadModules(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(repoRoot, "go.work"), filepath.Join(tree, "go.work"))
	for _, m := range mods {
		copyFile(t, filepath.Join(repoRoot, m.Dir, "go.mod"), filepath.Join(tree, m.Dir, "go.mod"))
	}
	const v = "v0.9.1"
	if err := setVersions(tree, mods, v, true); err != nil {
		t.Fatal(err)
	}
	for _, m := range mods {
		f, err := readGoMod(tree, m.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range f.Require {
			if strings.HasPrefix(r.Mod.Path, "github.com/outboxd/outbox") && r.Mod.Version != v {
				t.Errorf("%s requires %s", m.Dir, r.Mod)
			}
		}
		data, err := os.ReadFile(filepath.Join(tree, m.Dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case m.Released && (len(f.Replace) > 0 || strings.Contains(string(data), "from this checkout")):
			t.Errorf("released %s keeps replace directives or their comment:\n%s", m.Dir, data)
		case !m.Released && len(m.Requires) > 0 && len(f.Replace) == 0:
			t.Errorf("unreleased %s lost its replace directives", m.Dir)
		}
	}
}

// version is the version the install test releases: any will do, as nothing leaves
// the test's folders.
const version = "v0.1.0-installtest"

// TestReleaseInstalls prepares a release of this checkout's modules (its files as they
// are, tracked or new) into a file GOPROXY, as `go run ./internal/release -proxy` does, and
// installs it offline as a stranger would: with that proxy and this machine's module
// cache as the only module sources, and an empty GOPATH. The CLI installs with `go
// install …@version` and says its version; services that import the writer, the
// relay with NATS and CDC, and the inbox with Kafka build; and the checkout as it is
// does not install, because of its replace directives. The proxy holds only the
// released modules, so an importer that needed a test-only module would fail here.
func TestReleaseInstalls(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the CLI and three services from a release")
	}
	for _, tool := range []string{"go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s command: %v", tool, err)
		}
	}
	ctx := t.Context()
	cache := machineCache(ctx, t)
	offline := fileURL(cache) + ",off"

	tree := filepath.Join(t.TempDir(), "tree")
	copyCheckout(t, tree)

	t.Run("the checkout as it is does not install", func(t *testing.T) {
		proxy := t.TempDir()
		if err := publish(proxy, "github.com/outboxd/outbox/cmd/outbox", version, filepath.Join(tree, "cmd", "outbox")); err != nil {
			t.Fatal(err)
		}
		env := stranger(t)
		env.Proxy = fileURL(proxy) + "," + offline
		out, err := env.run(ctx, t.TempDir(), "install", "github.com/outboxd/outbox/cmd/outbox@"+version)
		if err == nil || !strings.Contains(out, "replace directives") {
			t.Fatalf("go install of the checkout as it is: %v\n%s", err, out)
		}
	})

	// The modules' part of prepare: the changelog may have nothing to release today
	// (TestReleaseCommand runs the whole command).
	proxy := filepath.Join(t.TempDir(), "proxy")
	var p prepared
	if err := prepareModules(ctx, tree, version, proxy, goEnv{Proxy: offline, ModCache: t.TempDir()}, &p); err != nil {
		t.Fatal(err)
	}
	for _, m := range p.Released() {
		gomod, err := os.ReadFile(filepath.Join(tree, m.Dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(gomod), "\nreplace") {
			t.Errorf("released %s has a replace directive:\n%s", m.Dir, gomod)
		}
	}
	env := stranger(t)
	env.Proxy = fileURL(proxy) + "," + offline

	t.Run("go install the CLI", func(t *testing.T) {
		bin := t.TempDir()
		env := env
		env.Extra = append(slices.Clone(env.Extra), "GOBIN="+bin)
		if out, err := env.run(ctx, t.TempDir(), "install", "github.com/outboxd/outbox/cmd/outbox@"+version); err != nil {
			t.Fatal(err, out)
		}
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "outbox"), "version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "outbox "+version+" ") {
			t.Fatalf("outbox version: %v: %s", err, out)
		}
	})
	for _, svc := range []struct {
		name, code string
		requires   []string
		maxModules int
	}{
		{"writer with pgx", writerService, []string{""}, maxImporterModules},
		{"relay with NATS and CDC", relayService, []string{"/relay", "/broker/nats", "/pgcdc"}, 0},
		{"inbox with Kafka", inboxService, []string{"/inbox", "/inbox/kafkainbox"}, 0},
	} {
		t.Run(svc.name, func(t *testing.T) {
			mods := buildService(ctx, t, env, svc.code, svc.requires)
			if svc.maxModules > 0 && len(mods) > svc.maxModules {
				t.Errorf("the service's graph holds %d modules, over %d:\n%s", len(mods), svc.maxModules, strings.Join(mods, "\n"))
			}
			t.Logf("%d modules in its graph", len(mods))
		})
	}
}

// maxImporterModules bounds what a service that writes events with pgx pays for the
// root module: every module in its graph (`go mod graph`), its own included.
const maxImporterModules = 25

// heavy are dependencies a service that only writes events must not have in its graph.
var heavy = []string{"nats-io", "franz-go", "chromedp", "gorm.io", "aws-sdk", "cloud.google.com", "google.golang.org/grpc", "modernc.org", "prometheus", "opentelemetry"}

const writerService = `package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

func main() {
	pool, err := pgxpool.New(context.Background(), "")
	if err != nil {
		panic(err)
	}
	if _, err := outbox.NewWriter(outboxpgx.New(pool, nil), nil); err != nil {
		panic(err)
	}
}
`

const relayService = `package main

import (
	"github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

var _, _, _ = relay.New, nats.New, pgcdc.New

func main() {}
`

const inboxService = `package main

import (
	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/inbox/kafkainbox"
)

var _, _ = inbox.NewPgx, kafkainbox.Message

func main() {}
`

// buildService makes a module of code that requires the given modules of this
// repository (paths after github.com/outboxd/outbox) at the release's version, tidies
// and builds it, and returns the modules of its graph. Its go line is the oldest
// the root module allows; requiring the release must not raise it for the writer.
func buildService(ctx context.Context, t *testing.T, env goEnv, code string, requires []string) []string {
	t.Helper()
	dir := t.TempDir()
	gomod := "module example.com/svc\n\ngo 1.25.0\n\nrequire (\n"
	for _, r := range requires {
		gomod += "\tgithub.com/outboxd/outbox" + r + " " + version + "\n"
	}
	gomod += ")\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", os.DevNull, "."}} {
		if out, err := env.run(ctx, dir, args...); err != nil {
			t.Fatal(err, out)
		}
	}
	// The graph's modules as `go mod graph` names them (`go list -m all` would also
	// want each one's .info, which an offline cache need not have).
	out, err := env.run(ctx, dir, "mod", "graph")
	if err != nil {
		t.Fatal(err, out)
	}
	var mods []string
	for _, node := range strings.Fields(out) {
		path, _, _ := strings.Cut(node, "@")
		if path != "go" && path != "toolchain" && !slices.Contains(mods, path) {
			mods = append(mods, path)
		}
	}
	writer := len(requires) == 1 && requires[0] == ""
	for _, m := range mods {
		for _, u := range unreleased {
			if m == "github.com/outboxd/outbox/"+u {
				t.Errorf("the service's graph holds %s, which is not released", m)
			}
		}
		for _, h := range heavy {
			if writer && strings.Contains(m, h) {
				t.Errorf("a service that only writes events has %s in its graph", m)
			}
		}
	}
	if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatal(err)
	} else if f, err := modfile.Parse("go.mod", data, nil); err != nil {
		t.Fatal(err)
	} else if writer && f.Go.Version != "1.25.0" {
		t.Errorf("the writer raised the service's go line to %s", f.Go.Version)
	}
	return mods
}

// stranger is the go command of someone outside this repository: an empty GOPATH
// (so an empty module cache) and no checksum database to ask (the test is offline;
// go.sum files still check every module). -trimpath lets the build cache serve the
// third parties' packages already compiled on this machine.
func stranger(t *testing.T) goEnv {
	t.Helper()
	gopath := t.TempDir()
	return goEnv{
		ModCache: filepath.Join(gopath, "pkg", "mod"),
		Extra:    []string{"GOPATH=" + gopath, "GOSUMDB=off", "GOFLAGS=-mod=mod -modcacherw -trimpath"},
	}
}

// machineCache returns this machine's module cache as a file proxy's folder, after
// making sure it holds every module the released modules require: the only step that
// may use the network (the machine's GOPROXY), and one that costs nothing once done.
func machineCache(ctx context.Context, t *testing.T) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	mods, err := loadModules(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mods {
		if !m.Released {
			continue
		}
		cmd := exec.CommandContext(ctx, "go", "mod", "download")
		cmd.Dir = filepath.Join(repoRoot, m.Dir)
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			if strings.Contains(string(out), "dial tcp") || strings.Contains(string(out), "no such host") {
				testenv.Missing(t, "the module proxy: %s", out)
			}
			t.Fatalf("go mod download in %s: %v\n%s", m.Dir, err, out)
		}
	}
	return filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
}

// copyCheckout copies the checkout's files, tracked or new but not ignored, to dst.
func copyCheckout(t *testing.T, dst string) {
	t.Helper()
	out, err := exec.Command("git", "-C", repoRoot, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(repoRoot, name)
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the checkout, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().IsRegular() {
			copyFile(t, src, filepath.Join(dst, name))
		}
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close() }()
	fi, err := in.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseCommand cuts a release in a clone of this checkout's HEAD, as a
// maintainer would, and checks what the command leaves: every released module tagged
// at a commit whose released go.mod files replace nothing, the branch back to
// development after it (replace directives back, requirements at the version), a
// clean tree, and nothing done by a second run.
func TestReleaseCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: prepares a release")
	}
	for _, tool := range []string{"go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s command: %v", tool, err)
		}
	}
	ctx := t.Context()
	machineCache(ctx, t)
	for _, kv := range [][2]string{{"GIT_AUTHOR_NAME", "release test"}, {"GIT_AUTHOR_EMAIL", "release@test"}, {"GIT_COMMITTER_NAME", "release test"}, {"GIT_COMMITTER_EMAIL", "release@test"}} {
		t.Setenv(kv[0], kv[1])
	}
	clone := filepath.Join(t.TempDir(), "clone")
	mustGit(ctx, t, repoRoot, "clone", "--quiet", "--no-local", "--no-tags", ".", clone)
	// Something to release, whatever the checkout's changelog says today.
	changelog := filepath.Join(clone, "CHANGELOG.md")
	text, err := os.ReadFile(changelog)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(changelog, []byte(strings.Replace(string(text), "\n"+unreleasedHeading, "\n"+unreleasedHeading+"\n- A change to release.\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	const v = "v0.1.0-commandtest"
	var out strings.Builder
	if err := run(ctx, &out, options{Dir: clone, Version: v, Date: "2026-12-06"}); err == nil || !strings.Contains(err.Error(), "uncommitted changes") {
		t.Fatalf("a release of a changed tree: %v", err)
	}
	mustGit(ctx, t, clone, "commit", "--quiet", "--all", "--message", "A change")
	start := mustGit(ctx, t, clone, "rev-parse", "HEAD")
	if err := run(ctx, &out, options{Dir: clone, Version: v, Date: "2026-12-06"}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	mods, err := loadModules(clone)
	if err != nil {
		t.Fatal(err)
	}
	rel := mustGit(ctx, t, clone, "rev-parse", v+"^{commit}")
	if parent := mustGit(ctx, t, clone, "rev-parse", rel+"^"); parent != start {
		t.Errorf("the release commit's parent is %s, want %s", parent, start)
	}
	if head := mustGit(ctx, t, clone, "rev-parse", "HEAD^"); head != rel {
		t.Errorf("HEAD's parent is %s, want the release commit %s", head, rel)
	}
	if st := mustGit(ctx, t, clone, "status", "--porcelain"); st != "" {
		t.Errorf("the tree is not clean:\n%s", st)
	}
	for _, m := range mods {
		file := strings.TrimPrefix(m.Dir+"/go.mod", "./")
		released := mustGit(ctx, t, clone, "show", rel+":"+file)
		dev := mustGit(ctx, t, clone, "show", "HEAD:"+file)
		if m.Released {
			if c := mustGit(ctx, t, clone, "rev-parse", m.Tag(v)+"^{commit}"); c != rel {
				t.Errorf("%s is at %s, want %s", m.Tag(v), c, rel)
			}
			if strings.Contains(released, "\nreplace") {
				t.Errorf("%s at the release has a replace directive:\n%s", file, released)
			}
		}
		if len(m.Requires) > 0 && (!strings.Contains(dev, "\nreplace") || !strings.Contains(dev, " "+v+"\n")) {
			t.Errorf("%s after the release: want replace directives and requirements at %s:\n%s", file, v, dev)
		}
	}
	if log := mustGit(ctx, t, clone, "log", "--format=%s", "-2"); log != "Back to development after "+v+"\nRelease "+v {
		t.Errorf("the last commits:\n%s", log)
	}

	head := mustGit(ctx, t, clone, "rev-parse", "HEAD")
	out.Reset()
	if err := run(ctx, &out, options{Dir: clone, Version: v, Date: "2026-12-07"}); err != nil {
		t.Fatalf("a second run: %v", err)
	}
	if !strings.Contains(out.String(), "already released") || mustGit(ctx, t, clone, "rev-parse", "HEAD") != head {
		t.Errorf("a second run did something:\n%s", out.String())
	}
}

func mustGit(ctx context.Context, t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := git(ctx, dir, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
