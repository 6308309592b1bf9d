package outbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxd/outbox/internal/testenv"
)

// maxImporterModules bounds what a service that writes events with pgx pays for this
// module: every module `go list -m all` names in its build, its own included.
const maxImporterModules = 25

// TestImporterModuleGraph builds a throwaway service that imports only the writer and
// outboxpgx (and pgxpool, to open its pool), against this checkout, and counts the
// modules in its graph: test-only and publisher dependencies of the project's other
// modules stay out of it, and its go line is not raised above this module's.
func TestImporterModuleGraph(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/svc\n\ngo 1.25.0\n\n"+
		"require github.com/outboxd/outbox v0.0.0-00010101000000-000000000000\n\n"+
		"replace github.com/outboxd/outbox => "+root+"\n")
	write("main.go", `package main

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
`)
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Its own module, as an importer's is: not this checkout's workspace.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "dial tcp") || strings.Contains(string(out), "no such host") {
				testenv.Missing(t, "the module proxy: %s", out)
			}
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	gocmd("mod", "tidy")
	gocmd("build", "-o", os.DevNull, ".")
	mods := strings.Fields(gocmd("list", "-m", "-f", "{{.Path}}", "all"))
	if len(mods) > maxImporterModules {
		t.Errorf("the service's graph holds %d modules, over %d:\n%s", len(mods), maxImporterModules, strings.Join(mods, "\n"))
	}
	for _, m := range mods {
		for _, banned := range []string{"nats-io", "franz-go", "chromedp", "gorm.io", "aws-sdk", "cloud.google.com", "google.golang.org/grpc", "modernc.org", "prometheus", "opentelemetry"} {
			if strings.Contains(m, banned) {
				t.Errorf("the service's graph holds %s", m)
			}
		}
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gomod), "\ngo 1.25.0\n") {
		t.Errorf("the service's go line was raised:\n%s", gomod)
	}
	t.Logf("%d modules: %s", len(mods), strings.Join(mods, " "))
}

// TestEveryModuleInTheWorkspace: every go.mod of the repository is in go.work (so the
// README's test command, which runs the workspace, runs its tests), says the oldest
// Go it needs without a patch level (a release's .0 at most), and names the
// toolchain the project builds with.
func TestEveryModuleInTheWorkspace(t *testing.T) {
	work, err := os.ReadFile("go.work")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, line := range strings.Split(string(work), "\n") {
		if f := strings.Fields(line); len(f) == 1 && (f[0] == "." || strings.HasPrefix(f[0], "./")) {
			used[filepath.Clean(f[0])] = true
		}
	}
	goLine := regexp.MustCompile(`(?m)^go 1\.\d+\.0$`)
	toolchain := regexp.MustCompile(`(?m)^toolchain go1\.\d+\.\d+$`)
	n := 0
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != ".") {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		n++
		dir := filepath.Dir(path)
		if !used[dir] {
			t.Errorf("%s is not in go.work", path)
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !goLine.Match(text) || !toolchain.Match(text) {
			t.Errorf("%s: want a go line without a patch level (go 1.N.0) and a toolchain line", path)
		}
		delete(used, dir)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range used {
		t.Errorf("go.work uses %s, which has no go.mod", dir)
	}
	if n < 2 {
		t.Fatalf("found %d go.mod files", n)
	}
}
