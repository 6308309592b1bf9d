package outbox_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

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
