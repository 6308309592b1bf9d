// Package version reads what the Go toolchain stamped into the binary: the module
// version, the VCS revision and the Go version. `outbox version`, the relay's start
// line and the outbox_build_info metric say the same thing.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Info is what a binary knows of its own build.
type Info struct {
	// Version is the main module's version: a release tag (v1.2.3) for a binary
	// built by `go install module@version` or by the image's build at a release's
	// tag; "(devel)" or a pseudo-version for one built from any other checkout.
	Version string
	// Revision is the VCS commit a checkout was built from ("" when not stamped:
	// `go run`, `go test`, -buildvcs=false), with Modified set for uncommitted changes.
	Revision string
	Modified bool
	// Go is the toolchain's version (go1.26.0).
	Go string
}

// stamped is the release a binary built from a checkout of its tag carries, set at
// link time by the image's build (deploy/image/build.sh: -ldflags -X
// github.com/outboxd/outbox/internal/version.stamped=v1.2.3). The go command knows
// the version of a binary built by `go install module@version`; in the repository's
// workspace it says "(devel)", or a pseudo-version of the commit with -buildvcs=true,
// as the tags are the modules' (relay/v1.2.3) and not the workspace's.
var stamped string

// Get returns the running binary's build information.
func Get() Info {
	i := Info{Version: "(devel)", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok && bi.Main.Version != "" {
		i.Version = bi.Main.Version
	}
	if stamped != "" {
		i.Version = stamped
	}
	if !ok {
		return i
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.modified":
			i.Modified = s.Value == "true"
		}
	}
	return i
}

// Short is the revision cut to 12 characters, "+dirty" when modified, or
// "unknown".
func (i Info) Short() string {
	if i.Revision == "" {
		return "unknown"
	}
	r := i.Revision[:min(12, len(i.Revision))]
	if i.Modified {
		r += "+dirty"
	}
	return r
}

// String is one line: "outbox v1.2.3 (revision 0123456789ab, go1.26.0 linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("outbox %s (revision %s, %s %s/%s)", i.Version, i.Short(), i.Go, runtime.GOOS, runtime.GOARCH)
}
