package layering

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/goaccel/goaccel/"

// layers lists goaccel's packages from the bottom up, by path prefix (the longest prefix decides). A
// package may import packages of its own layer's lower neighbours only: strictly lower layers, and within
// a layer nothing (the packages of a layer are independent of each other), except where sameLayer allows.
// docs/architecture.md draws the same table.
var layers = [][]string{
	// 0: helpers below everything, the data formats and the release.
	{"internal/floats", "internal/half", "internal/vec32", "internal/classlabels", "internal/jobenv", "version",
		"checkpoint", "datasets/idx", "internal/traceevent", "internal/heap"},
	// 1: the demo's data.
	{"datasets/fashionmnist"},
	// 2: collectives, and the compute backend with its kernels.
	{"backends", "cpu"},
	// 3: helpers over the collectives.
	{"internal/replicas"},
	// 4: when and how gradients are synchronised.
	{"accumulate"},
	// 5: graph helpers of the gradient path, and the layout of sharded optimizer state.
	{"internal/bucketgraph", "internal/blockstate"},
	// 6: the user's objects, prepared.
	{"prepare", "userstate"},
	// 7: what is sized or measured over prepared objects.
	{"schedule", "metrics"},
	// 8: the facade.
	{"accel"},
	// 9: the launcher's library: above the job's packages, which never import it (they read what it says
	// through internal/jobenv); its processes' side of a check (rankcheck) is the one part on a communicator.
	{"internal/launch"},
	// 10: test harnesses (tests may import any package; harnesses are shared by tests and the benchmarks).
	{"internal/testing"},
	// 11: programs, benchmarks, and this test.
	{"cmd", "examples", "internal/bench", "internal/layering"},
}

// sameLayer lists the imports allowed within one layer: a package family's own subpackages (an engine
// registering with its registry, kernels reaching their internal packages).
var sameLayer = map[string][]string{
	"backends/mpi":          {"backends"},
	"backends/enginetest":   {"backends"},
	"cpu/kernels":           {"cpu"},
	"datasets/fashionmnist": {"datasets/idx"},
}

// layerOf returns the layer of a package path (relative to the module) and the prefix that placed it.
func layerOf(pkg string) (int, string) {
	best, bestPrefix := -1, ""
	for i, prefixes := range layers {
		for _, p := range prefixes {
			if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > len(bestPrefix) {
				best, bestPrefix = i, p
			}
		}
	}
	return best, bestPrefix
}

type listedPackage struct {
	ImportPath string
	Imports    []string
}

// TestImportsRunDownward: no package imports one of its own layer or a higher one. Test files are not
// listed (go list's Imports): tests may reach any package.
func TestImportsRunDownward(t *testing.T) {
	for _, tags := range []string{"", "mpi,blas"} {
		cmd := exec.Command("go", "list", "-tags", tags, "-json=ImportPath,Imports", module+"...")
		out, err := cmd.Output()
		require.NoError(t, err, "go list")
		dec := json.NewDecoder(strings.NewReader(string(out)))
		for {
			var p listedPackage
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else {
				require.NoError(t, err)
			}
			pkg := strings.TrimPrefix(p.ImportPath, module)
			layer, prefix := layerOf(pkg)
			if !assert.GreaterOrEqual(t, layer, 0, "package %s is in no layer: add it to layers (and docs/architecture.md)", pkg) {
				continue
			}
			for _, imp := range p.Imports {
				if !strings.HasPrefix(imp, module) {
					continue
				}
				dep := strings.TrimPrefix(imp, module)
				depLayer, depPrefix := layerOf(dep)
				switch {
				case depLayer < layer:
				case depPrefix == prefix:
					// A family's packages among themselves (cpu/internal/…, examples/…) are one unit.
				case contains(sameLayer[pkg], dep):
				default:
					t.Errorf("%s (layer %d) imports %s (layer %d): imports must run to lower layers", pkg, layer, dep, depLayer)
				}
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestLoopExamplesImportOnlyAccel: the minimal and classifier examples are what a user's loop looks like,
// and a loop needs one goaccel import.
func TestLoopExamplesImportOnlyAccel(t *testing.T) {
	for _, example := range []string{"examples/minimal", "examples/classifier"} {
		out, err := exec.Command("go", "list", "-test", "-json=ImportPath,Imports", module+example).Output()
		require.NoError(t, err)
		dec := json.NewDecoder(strings.NewReader(string(out)))
		for {
			var p listedPackage
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else {
				require.NoError(t, err)
			}
			for _, imp := range p.Imports {
				if strings.HasPrefix(imp, module) && !strings.HasPrefix(imp, module+example) {
					assert.Equal(t, module+"accel", imp, "%s imports %s: a training loop needs accel alone", p.ImportPath, imp)
				}
			}
		}
	}
}
