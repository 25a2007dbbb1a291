package kernels

import (
	"fmt"
	"runtime/debug"
)

// The kernels reach into GoMLX's pure-Go backend through unexported symbols (go:linkname), unsafe reads and
// writes of simplego.Node's fields and reflection on its private node data. Those are stable only within
// one GoMLX release: another release may keep a field's name and change what an executor receives, and
// then a patch corrupts memory instead of failing a check. So the kernels install only on the release they
// were written against; on any other, training runs on GoMLX's own kernels, and `accel env` and the job's
// first lines say so.
const (
	gomlxModule = "github.com/gomlx/gomlx"
	// SupportedGoMLX is the one GoMLX release the kernels were written and tested against.
	SupportedGoMLX = "v0.26.0"
)

// gomlxVersion reads the GoMLX version linked into this binary from its build information: the version
// of the module that replaces it if replaced ("(devel)" for a local directory), "" when the binary lists
// no dependencies. Go records none in test binaries, whose GoMLX is the one the main module's go.mod
// requires; a variable so that tests can present another release.
var gomlxVersion = func() (version string, listed bool) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", false
	}
	for _, dep := range info.Deps {
		if dep.Path != gomlxModule {
			continue
		}
		if dep.Replace != nil {
			return dep.Replace.Version, true
		}
		return dep.Version, true
	}
	return "", len(info.Deps) > 0
}

// unsupported says why the kernels must stay inert in this binary, or "" when they may install.
//
// A binary that lists dependencies without GoMLX cannot be running these kernels at all; one that lists
// none (a test binary) was built by the go command from a module graph that selected GoMLX, and there the
// structural checks of gomlxpatch (field names, types and offsets of simplego.Node and its node data)
// still guard the reads and writes.
func unsupported() string {
	version, listed := gomlxVersion()
	switch {
	case !listed:
		return ""
	case version == SupportedGoMLX:
		return ""
	case version == "":
		return fmt.Sprintf("this binary does not record a %s version; goaccel's kernels need %s", gomlxModule, SupportedGoMLX)
	default:
		return fmt.Sprintf("this binary links %s %s; goaccel's kernels were written against %s and stay off, "+
			"so training runs on GoMLX's own kernels (slower, same results)", gomlxModule, version, SupportedGoMLX)
	}
}
