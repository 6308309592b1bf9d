// Command release cuts a release of this repository: one version for every module
// it publishes, installable with `go install module@version` and importable with
// `go get`, from one command run in a clean checkout:
//
//	go run ./internal/release -n v0.2.0   # print what it would do, change nothing
//	go run ./internal/release v0.2.0      # commit, tag, and go back to development
//
// In a temporary worktree of HEAD it cuts CHANGELOG.md's Unreleased section, makes
// the Kubernetes manifests name the version's image, rewrites every go.mod to
// require the repository's modules at the version and drops the replace
// directives that development needs (go install refuses a module that has any), and
// tidies each released module against a file proxy of the release itself, so that
// its go.sum holds its siblings' sums. It commits that as "Release vX.Y.Z", tags
// every released module there (relay/vX.Y.Z, ...), then commits the go.mod files
// back to development (the replace directives restored, the requirements left at
// the version) and fast-forwards the current branch. Run again for a version
// already tagged, it says so and changes nothing. docs/layout.md#releasing has the
// whole procedure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

func main() {
	o := options{Dir: "."}
	flag.BoolVar(&o.DryRun, "n", false, "print what the release would do and change nothing")
	flag.StringVar(&o.ProxyDir, "proxy", "", "also write the release's modules to this `folder`, a file GOPROXY to try an install from before pushing")
	flag.StringVar(&o.Date, "date", time.Now().UTC().Format(time.DateOnly), "the release's date in CHANGELOG.md")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./internal/release [-n] [-proxy folder] [-date YYYY-MM-DD] vX.Y.Z\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	o.Version = flag.Arg(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

type options struct {
	Dir      string // inside the checkout to release
	Version  string
	Date     string
	DryRun   bool
	ProxyDir string
}

// checkVersion accepts a canonical semantic version without build metadata, the
// only kind a module proxy serves.
func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("%q is not a version a module can have: want vMAJOR.MINOR.PATCH, as v0.2.0 or v1.0.0-rc.1", v)
	}
	if semver.Major(v) != "v0" && semver.Major(v) != "v1" {
		return fmt.Errorf("%s: a major version above v1 changes every module's path (/%s), which this command does not do", v, semver.Major(v))
	}
	return nil
}

func run(ctx context.Context, w io.Writer, o options) error {
	if err := checkVersion(o.Version); err != nil {
		return err
	}
	root, err := git(ctx, o.Dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	mods, err := loadModules(root)
	if err != nil {
		return err
	}
	done, err := alreadyTagged(ctx, root, mods, o.Version)
	if err != nil || done != "" {
		if done != "" {
			fmt.Fprintf(w, "%s is already released (tagged at %s): nothing to do\n", o.Version, done)
		}
		return err
	}
	if !o.DryRun {
		if st, err := git(ctx, root, "status", "--porcelain", "--untracked-files=no"); err != nil {
			return err
		} else if st != "" {
			return fmt.Errorf("the checkout has uncommitted changes; commit or stash them first:\n%s", st)
		}
	}
	head, err := git(ctx, root, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "outbox-release-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	work := filepath.Join(tmp, "tree")
	if _, err := git(ctx, root, "worktree", "add", "--quiet", "--detach", work, head); err != nil {
		return err
	}
	defer func() { _, _ = git(context.WithoutCancel(ctx), root, "worktree", "remove", "--force", work) }()

	proxyDir := o.ProxyDir
	if proxyDir == "" {
		proxyDir = filepath.Join(tmp, "proxy")
	}
	env, err := machineProxy(ctx)
	if err != nil {
		return err
	}
	env.ModCache = filepath.Join(tmp, "modcache")
	fmt.Fprintf(w, "preparing %s from %s (each released module tidied against the release)\n", o.Version, head[:12])
	p, err := prepare(ctx, work, o.Version, o.Date, proxyDir, env)
	if err != nil {
		return err
	}
	stat, err := git(ctx, work, "diff", "--stat")
	if err != nil {
		return err
	}
	printPlan(w, p, o, stat)
	if o.DryRun {
		fmt.Fprintln(w, "dry run: nothing committed or tagged")
		return nil
	}

	if err := commit(ctx, work, "Release "+o.Version); err != nil {
		return err
	}
	for _, m := range p.Released() {
		if _, err := git(ctx, work, "tag", "--annotate", m.Tag(o.Version), "--message", m.Path+" "+o.Version); err != nil {
			return err
		}
	}
	if err := backToDevelopment(ctx, work, head, p.Modules, o.Version); err != nil {
		return err
	}
	if err := commit(ctx, work, "Back to development after "+o.Version); err != nil {
		return err
	}
	next, err := git(ctx, work, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	if _, err := git(ctx, root, "merge", "--quiet", "--ff-only", next); err != nil {
		return fmt.Errorf("the release is tagged, but the branch could not be fast-forwarded to %s: %w", next[:12], err)
	}
	fmt.Fprintf(w, "released %s: %d tags at the release commit; the branch is back to development\n", o.Version, len(p.Released()))
	fmt.Fprintf(w, "publish it:\n\tgit push origin HEAD")
	for _, m := range p.Released() {
		fmt.Fprintf(w, " %s", m.Tag(o.Version))
	}
	fmt.Fprintf(w, "\n\tgit checkout %s && deploy/image/build.sh ghcr.io/outboxd/outbox:%s && podman push ghcr.io/outboxd/outbox:%s\n", o.Version, o.Version, o.Version)
	return nil
}

// alreadyTagged returns the commit a finished release of version is tagged at, or
// "" when none of its tags exists. Some tags but not all is an error: a release
// stopped halfway, to be finished by hand.
func alreadyTagged(ctx context.Context, root string, mods []repoModule, version string) (string, error) {
	var have, missing []string
	commits := map[string]bool{}
	for _, m := range mods {
		if !m.Released {
			continue
		}
		c, err := git(ctx, root, "rev-parse", "--quiet", "--verify", "refs/tags/"+m.Tag(version)+"^{commit}")
		if err != nil {
			missing = append(missing, m.Tag(version))
			continue
		}
		have = append(have, m.Tag(version))
		commits[c] = true
	}
	switch {
	case len(have) == 0:
		return "", nil
	case len(missing) > 0:
		return "", fmt.Errorf("%s is partly tagged: %s exist, %s do not", version, strings.Join(have, " "), strings.Join(missing, " "))
	case len(commits) > 1:
		return "", fmt.Errorf("the tags of %s point at %d different commits", version, len(commits))
	}
	for c := range commits {
		return c[:12], nil
	}
	return "", nil
}

// backToDevelopment restores every go.mod and go.sum of work as they were at the
// commit the release started from, with the repository's modules required at
// version: the replace directives are back for development, and a pseudo-version
// of the branch resolves for an importer.
func backToDevelopment(ctx context.Context, work, from string, mods []repoModule, version string) error {
	for _, m := range mods {
		for _, name := range []string{"go.mod", "go.sum"} {
			file := strings.TrimPrefix(m.Dir+"/"+name, "./")
			if _, err := git(ctx, work, "cat-file", "-e", from+":"+file); err != nil {
				continue
			}
			if _, err := git(ctx, work, "checkout", from, "--", file); err != nil {
				return err
			}
		}
	}
	return setVersions(work, mods, version, false)
}

func printPlan(w io.Writer, p prepared, o options, stat string) {
	fmt.Fprintf(w, "release %s (%s)\n", o.Version, o.Date)
	fmt.Fprintf(w, "  tags (%d):", len(p.Released()))
	for _, m := range p.Released() {
		fmt.Fprintf(w, " %s", m.Tag(o.Version))
	}
	fmt.Fprintf(w, "\n  not released:")
	for _, m := range p.Modules {
		if !m.Released {
			fmt.Fprintf(w, " %s", m.Dir)
		}
	}
	fmt.Fprintf(w, "\n  CHANGELOG.md: Unreleased becomes %s\n", o.Version)
	if len(p.Images) > 0 {
		fmt.Fprintf(w, "  image ghcr.io/outboxd/outbox:%s in %s\n", o.Version, strings.Join(p.Images, ", "))
	} else {
		fmt.Fprintf(w, "  image: the manifests name ghcr.io/outboxd/outbox:%s already\n", o.Version)
	}
	fmt.Fprintf(w, "  the release commit changes:\n%s\n", indent(stat))
	if o.ProxyDir != "" {
		fmt.Fprintf(w, "  the release's modules are in %s; try them with\n\tGOPROXY=%s,$(go env GOPROXY) GONOSUMDB=github.com/outboxd/outbox go install github.com/outboxd/outbox/cmd/outbox@%s\n",
			o.ProxyDir, fileURL(o.ProxyDir), o.Version)
	}
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// machineProxy is where prepare finds third parties' modules: this machine's module
// cache first (as a file proxy), then its GOPROXY.
func machineProxy(ctx context.Context) (goEnv, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE", "GOPROXY").Output()
	if err != nil {
		return goEnv{}, fmt.Errorf("go env: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		return goEnv{}, fmt.Errorf("go env: unexpected output %q", out)
	}
	return goEnv{Proxy: fileURL(filepath.Join(lines[0], "cache", "download")) + "," + lines[1]}, nil
}

func commit(ctx context.Context, dir, message string) error {
	if _, err := git(ctx, dir, "add", "--all"); err != nil {
		return err
	}
	_, err := git(ctx, dir, "commit", "--quiet", "--message", message)
	return err
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("git %s: %s", strings.Join(args, " "), strings.TrimSpace(stderr.String()))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
