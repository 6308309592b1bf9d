package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// prepared is what prepare made of a tree.
type prepared struct {
	Modules   []repoModule // every module, in dependency order
	Changelog bool         // CHANGELOG.md was cut
	Images    []string     // manifests whose image now names the version
}

// Released returns the modules a release tags.
func (p prepared) Released() []repoModule {
	var out []repoModule
	for _, m := range p.Modules {
		if m.Released {
			out = append(out, m)
		}
	}
	return out
}

// goEnv is the environment of the go commands prepare and the tests run: outside
// any workspace, with the toolchain of this machine.
type goEnv struct {
	// Proxy is the GOPROXY list: the release's own modules come from the file proxy
	// prepare writes, which goes first.
	Proxy string
	// ModCache is the module cache (GOMODCACHE) to fill; "" keeps the default.
	ModCache string
	// Extra are more KEY=value settings, last.
	Extra []string
}

func (e goEnv) run(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GOWORK=off",
		"GOTOOLCHAIN=local",
		"GOFLAGS=-mod=mod -modcacherw",
		"GOPROXY="+e.Proxy,
		// The release's modules are in no checksum database yet: their go.sum lines
		// come from the zips prepare makes.
		"GONOSUMDB=github.com/outboxd/outbox",
		"GOPRIVATE=",
	)
	if e.ModCache != "" {
		cmd.Env = append(cmd.Env, "GOMODCACHE="+e.ModCache)
	}
	cmd.Env = append(cmd.Env, e.Extra...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, out.String())
	}
	return out.String(), nil
}

// prepare turns the checkout at tree into the release of version: the changelog
// cut on date, the manifests naming the version's image, every go.mod requiring
// the repository's modules at version, and every released module tidied (so its
// go.sum holds the sums of the release's own modules) and written to the file
// proxy at proxyDir, each after the modules it requires. env.Proxy is where third
// parties' modules come from; prepare puts proxyDir before it.
func prepare(ctx context.Context, tree, version, date, proxyDir string, env goEnv) (prepared, error) {
	var p prepared
	changelog := filepath.Join(tree, "CHANGELOG.md")
	text, err := os.ReadFile(changelog)
	if err != nil {
		return p, err
	}
	cut, err := cutChangelog(string(text), version, date)
	if err != nil {
		return p, err
	}
	if err := os.WriteFile(changelog, []byte(cut), 0o644); err != nil {
		return p, err
	}
	p.Changelog = true
	if p.Images, err = setImage(tree, version); err != nil {
		return p, err
	}
	return p, prepareModules(ctx, tree, version, proxyDir, env, &p)
}

// prepareModules is prepare's part for the modules alone.
func prepareModules(ctx context.Context, tree, version, proxyDir string, env goEnv, p *prepared) error {
	mods, err := loadModules(tree)
	if err != nil {
		return err
	}
	p.Modules = mods
	if err := setVersions(tree, mods, version, true); err != nil {
		return err
	}
	env.Proxy = fileURL(proxyDir) + "," + env.Proxy
	for _, m := range p.Released() {
		dir := filepath.Join(tree, filepath.FromSlash(m.Dir))
		if _, err := env.run(ctx, dir, "mod", "tidy"); err != nil {
			return fmt.Errorf("%s: %w", m.Dir, err)
		}
		if err := publish(proxyDir, m.Path, version, dir); err != nil {
			return fmt.Errorf("%s: %w", m.Dir, err)
		}
	}
	return nil
}

// publish writes the module at dir, as version, into the file proxy at proxyDir, in
// the layout `go help goproxy` describes: the list of versions, and the version's
// info, go.mod and zip. The zip is made as the module proxy makes one from a tag.
func publish(proxyDir, path, version, dir string) error {
	esc, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	escV, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	at := filepath.Join(proxyDir, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(at, escV+".mod"), gomod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(at, escV+".info"), info, 0o644); err != nil {
		return err
	}
	z, err := os.Create(filepath.Join(at, escV+".zip"))
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(z, module.Version{Path: path, Version: version}, dir); err != nil {
		_ = z.Close()
		return err
	}
	if err := z.Close(); err != nil {
		return err
	}
	list, err := os.OpenFile(filepath.Join(at, "list"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = io.WriteString(list, version+"\n")
	return errors.Join(err, list.Close())
}

// fileURL is the GOPROXY entry of a folder.
func fileURL(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	return "file://" + filepath.ToSlash(abs)
}
