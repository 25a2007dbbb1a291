// Package version says which goaccel a program runs: the release it was built from, and, for a build
// inside a checkout, the commit. CHANGELOG.md lists what changed between releases, with migration notes.
package version

import (
	"fmt"
	"runtime/debug"
)

// Release is the semantic version of this source tree: the latest release, which CHANGELOG.md describes
// and a git tag v<Release> marks.
const Release = "0.5.0"

// modulePath is goaccel's module, as a dependency of another program.
const modulePath = "github.com/goaccel/goaccel"

// String is the version to report: the module version the Go toolchain recorded when goaccel is a
// dependency (v0.4.0, or a pseudo-version between releases), or the version of what replaced it; for a
// dependency replaced by a local directory, Release with that directory ("0.5.0 (local copy ../goaccel)");
// for a build of goaccel's own checkout, Release with its commit ("0.5.0 (commit 1a2b3c4d5e6f, modified)");
// else Release. The version comes from the library, never from the program's own module.
func String() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return Release
	}
	return fromBuildInfo(info)
}

func fromBuildInfo(info *debug.BuildInfo) string {
	for _, dep := range info.Deps {
		if dep.Path != modulePath {
			continue
		}
		if r := dep.Replace; r != nil {
			// A replace directive: the version in the program's go.mod (often v0.0.0) names nothing.
			if r.Version != "" && r.Version != "(devel)" {
				return r.Version
			}
			return fmt.Sprintf("%s (local copy %s)", Release, r.Path)
		}
		if dep.Version != "" && dep.Version != "(devel)" {
			return dep.Version
		}
		return Release
	}
	if info.Main.Path != modulePath {
		// goaccel is not among the dependencies (a test binary of another module lists none): the
		// program's own commit says nothing of goaccel's.
		return Release
	}
	if info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	var revision string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision == "" {
		return Release
	}
	if len(revision) > 12 {
		revision = revision[:12]
	}
	if modified {
		return fmt.Sprintf("%s (commit %s, modified)", Release, revision)
	}
	return fmt.Sprintf("%s (commit %s)", Release, revision)
}
