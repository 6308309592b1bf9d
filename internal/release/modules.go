package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
)

// unreleased are the modules a release does not tag: tests, examples, benchmarks and
// this command. No released module may require one of them, so that an importer never
// has to resolve a module that exists only for this repository's own use.
var unreleased = []string{
	"bench",
	"deploy/image",
	"deploy/kubernetes",
	"examples",
	"internal/foreign",
	"internal/poison",
	"internal/release",
}

// repoModule is one go.mod of the repository.
type repoModule struct {
	Path     string   // github.com/outboxd/outbox/relay
	Dir      string   // its folder from the repository's root, slash-separated ("." for the root)
	Released bool     // tagged by a release
	Requires []string // the repository's modules its go.mod requires
}

// Tag is the git tag of m's version v: Go's tags for a module in a subdirectory carry
// the folder as a prefix (relay/v1.2.3).
func (m repoModule) Tag(v string) string {
	if m.Dir == "." {
		return v
	}
	return m.Dir + "/" + v
}

// loadModules reads the modules go.work uses under root, in the order in which a
// release must prepare them: every module after the repository's modules it
// requires.
func loadModules(root string) ([]repoModule, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var mods []repoModule
	byPath := map[string]int{}
	for _, u := range work.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		f, err := readGoMod(root, dir)
		if err != nil {
			return nil, err
		}
		byPath[f.Module.Mod.Path] = len(mods)
		mods = append(mods, repoModule{Path: f.Module.Mod.Path, Dir: dir, Released: !slices.Contains(unreleased, dir)})
	}
	for _, dir := range unreleased {
		if !slices.ContainsFunc(mods, func(m repoModule) bool { return m.Dir == dir }) {
			return nil, fmt.Errorf("%s is listed as unreleased but go.work does not use it", dir)
		}
	}
	for i := range mods {
		f, err := readGoMod(root, mods[i].Dir)
		if err != nil {
			return nil, err
		}
		for _, r := range f.Require {
			j, ok := byPath[r.Mod.Path]
			if !ok {
				continue
			}
			if mods[i].Released && !mods[j].Released {
				return nil, fmt.Errorf("%s requires %s, which is not released: an importer could not resolve it", mods[i].Path, mods[j].Path)
			}
			mods[i].Requires = append(mods[i].Requires, r.Mod.Path)
		}
	}
	return dependencyOrder(mods, byPath)
}

// dependencyOrder sorts mods so that each comes after the modules it requires.
func dependencyOrder(mods []repoModule, byPath map[string]int) ([]repoModule, error) {
	const (
		unseen = iota
		visiting
		done
	)
	state := make([]int, len(mods))
	var order []repoModule
	var visit func(i int, chain []string) error
	visit = func(i int, chain []string) error {
		switch state[i] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("the modules require each other: %s", strings.Join(append(chain, mods[i].Path), " -> "))
		}
		state[i] = visiting
		for _, p := range mods[i].Requires {
			if err := visit(byPath[p], append(chain, mods[i].Path)); err != nil {
				return err
			}
		}
		state[i] = done
		order = append(order, mods[i])
		return nil
	}
	for i := range mods {
		if err := visit(i, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func readGoMod(root, dir string) (*modfile.File, error) {
	name := filepath.Join(root, filepath.FromSlash(dir), "go.mod")
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return modfile.Parse(name, data, nil)
}

// errReplaceLeft means a released go.mod would keep a replace directive, which
// `go install module@version` refuses.
var errReplaceLeft = errors.New("a released module keeps a replace directive")

// setVersions rewrites every go.mod under root to require the repository's modules
// at version. For a release, a released module loses its replace directives for them
// (they serve development only); an unreleased one keeps them, as it is only ever
// built from a checkout. Back in development, every module keeps them.
func setVersions(root string, mods []repoModule, version string, release bool) error {
	inRepo := map[string]bool{}
	for _, m := range mods {
		inRepo[m.Path] = true
	}
	for _, m := range mods {
		f, err := readGoMod(root, m.Dir)
		if err != nil {
			return err
		}
		for _, r := range f.Require {
			if inRepo[r.Mod.Path] {
				if err := f.AddRequire(r.Mod.Path, version); err != nil {
					return err
				}
			}
		}
		if release && m.Released {
			for _, r := range slices.Clone(f.Replace) {
				if inRepo[r.Old.Path] && modfile.IsDirectoryPath(r.New.Path) {
					if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
						return err
					}
				}
			}
			f.Cleanup() // drops the emptied entries
			if len(f.Replace) > 0 {
				return fmt.Errorf("%s: %w: %s", m.Dir, errReplaceLeft, f.Replace[0].Old.Path)
			}
		}
		if err := writeGoMod(root, m.Dir, f); err != nil {
			return err
		}
	}
	return nil
}

func writeGoMod(root, dir string, f *modfile.File) error {
	f.Cleanup()
	data, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, filepath.FromSlash(dir), "go.mod"), data, 0o644)
}
