package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"

	gomlxbackends "github.com/gomlx/gomlx/backends"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/backends/mpi"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/cpu/kernels"
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/version"
)

// entry is one line of the environment report.
type entry struct{ key, value string }

func (a *app) env(args []string) int {
	fs := flag.NewFlagSet("accel env", flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	devices := fs.Bool("devices", false, "start the compute backend even when it is not the pure-Go one "+
		"(loads the PJRT plugin; for CUDA this initialises the GPUs)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: accel env [--devices]\n\nPrints what goaccel sees on this machine, "+
			"for bug reports. Never downloads anything.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(a.stderr, "accel env: unexpected arguments %q\n", fs.Args())
		return 2
	}
	fmt.Fprintln(a.stdout, "Copy and paste the text below into your bug report.")
	fmt.Fprintln(a.stdout)
	printEntries(a.stdout, environmentReport(*devices))
	return 0
}

func printEntries(w io.Writer, entries []entry) {
	width := 0
	for _, e := range entries {
		width = max(width, len(e.key))
	}
	for _, e := range entries {
		fmt.Fprintf(w, "- %-*s %s\n", width+1, e.key+":", e.value)
	}
}

// environmentReport collects the report's entries, in a fixed order. Nothing in it may reach the network:
// cpu.Resolve turns GoMLX's plugin auto-install off before looking for plugins.
func environmentReport(startAnyBackend bool) []entry {
	// Read first: resolving the compute backend sets GOMLX_NO_AUTO_INSTALL in this process.
	environment := relevantEnvironment()
	entries := []entry{
		{"goaccel version", version.String()},
		{"Go version", runtime.Version()},
		{"Platform", runtime.GOOS + "/" + runtime.GOARCH},
		{"CPUs", fmt.Sprintf("%d usable (GOMAXPROCS %d)", runtime.NumCPU(), runtime.GOMAXPROCS(0))},
	}

	topo, err := backends.DetectTopology()
	if err != nil {
		entries = append(entries, entry{"Topology", "error: " + err.Error()})
	} else {
		entries = append(entries, entry{"Topology", topo.String()})
	}

	entries = append(entries, entry{"Collective engines", strings.Join(backends.Engines(), ", ")})
	mpiLib := "not linked (build with -tags mpi)"
	if v := mpi.LibraryVersion(); v != "" {
		mpiLib = firstLine(v)
	}
	entries = append(entries, entry{"MPI library", mpiLib})
	entries = append(entries, entry{"mpirun", describeMPIRun()})

	mca := "none needed here"
	if params := launch.DefaultMCA(); len(params) > 0 {
		var parts []string
		for _, p := range params {
			parts = append(parts, fmt.Sprintf("%s=%s (%s)", p.Name, p.Value, p.Why))
		}
		mca = strings.Join(parts, "; ")
	}
	entries = append(entries, entry{"Launcher MCA defaults", mca})

	// The configuration an Accelerator started here would resolve: the environment, read in one place.
	resolved, err := accel.Resolve()
	if err != nil {
		entries = append(entries, entry{"Configuration", "error: " + err.Error()})
		entries = append(entries, entry{"Environment", environment})
		return entries
	}
	entries = append(entries, entry{"Configuration", fmt.Sprintf("collective timeout %s, debug mode %t, "+
		"replica check %t, gradient compression %s, sharding %s, overlap %t", resolved.CollectiveTimeout,
		resolved.Debug, resolved.ReplicaCheck, resolved.GradientCompression, resolved.Sharding.Name(),
		resolved.Overlap)})
	computeCfg := resolved.Compute
	computeCfg.LocalRank, computeCfg.LocalSize = topo.LocalRank, topo.LocalSize
	config, reason := cpu.Resolve(computeCfg)
	computeCfg.Backend = config
	entries = append(entries, entry{"Compute backend", fmt.Sprintf("%s (%s)", config, reason)})
	entries = append(entries, entry{"Compute devices", describeDevices(computeCfg, startAnyBackend)})
	entries = append(entries, describeKernels(computeCfg, topo)...)

	entries = append(entries, entry{"Environment", environment})
	return entries
}

func describeMPIRun() string {
	path, err := exec.LookPath("mpirun")
	if err != nil {
		return "not found (apt-get install openmpi-bin libopenmpi-dev)"
	}
	flavor, err := launch.DetectFlavor("mpirun")
	if err != nil {
		return path + " (" + err.Error() + ")"
	}
	return fmt.Sprintf("%s (%s)", path, flavor)
}

// describeDevices starts the compute backend when that is cheap (the pure-Go one) or asked for, and lists
// its devices.
func describeDevices(cfg cpu.Config, startAnyBackend bool) string {
	name, _, _ := strings.Cut(cfg.Backend, ":")
	if name != cpu.PureGo && !startAnyBackend {
		return "not started (run `accel env --devices` to start " + cfg.Backend + ")"
	}
	backend, err := cpu.New(cfg)
	if err != nil {
		return "error: " + err.Error()
	}
	defer backend.Finalize()
	var devices []string
	for d := range backend.NumDevices() {
		devices = append(devices, fmt.Sprintf("#%d %s", d, backend.DeviceDescription(gomlxbackends.DeviceNum(d))))
	}
	return fmt.Sprintf("%d: %s [%s]", backend.NumDevices(), backend.Description(), strings.Join(devices, "; "))
}

// describeKernels says how the pure-Go backend will compute in a rank on this node: gradients, the
// matmul path and its thread budget. It sets the kernels up the way the Accelerator does (cheap, local).
func describeKernels(cfg cpu.Config, topo backends.Topology) []entry {
	name, _, _ := strings.Cut(cfg.Backend, ":")
	if name != cpu.PureGo {
		return []entry{{"Matmul", "the " + cfg.Backend + " backend's own"}}
	}
	if _, err := cpu.New(cfg); err != nil {
		return []entry{{"Matmul", "error: " + err.Error()}}
	}
	k := cpu.CurrentKernels()
	threads := "(pure-Go kernel: GOMAXPROCS)"
	if k.Threads > 0 {
		threads = fmt.Sprintf("%d per process × %d process(es) on this node", k.Threads, max(1, topo.LocalSize))
	}
	gradients := map[string]string{
		"gemm":  "gemm (gradients of matrix products, convolutions and pooling built as matrix products, by goaccel)",
		"gomlx": "gomlx (GoMLX's own gradient rules, slower on the pure-Go backend)",
	}[k.Gradients]
	ops := map[string]string{
		"sequential": "sequential (one operation of a graph at a time: this rank has one thread)",
		"parallel": "parallel (independent operations of a graph run at the same time, on GoMLX's own scheduling; " +
			"a training program measures it against one operation at a time on its first micro-batches and keeps the faster)",
	}[k.Ops]
	kernelSet := "goaccel's (written against GoMLX " + kernels.SupportedGoMLX + ", the release in this binary)"
	if k.Inert != "" {
		kernelSet = "GoMLX's own: " + k.Inert
	}
	return []entry{{"Kernels", kernelSet}, {"Gradients", cmp.Or(gradients, k.Gradients)}, {"Matmul", k.Matmul}, {"Matmul threads", threads},
		{"Operations", cmp.Or(ops, k.Ops)},
		{"Convolutions", k.Convolutions}, {"Element-wise", k.Elementwise}, {"Gathers and scatters", k.Indexing}}
}

// relevantEnvironment lists the variables that change what goaccel, GoMLX or Open MPI do.
func relevantEnvironment() string {
	var set []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains([]string{"GOMLX_BACKEND", "GOMLX_NO_AUTO_INSTALL", "PJRT_PLUGIN_LIBRARY_PATH",
			"CUDA_VISIBLE_DEVICES", "OPENBLAS_NUM_THREADS", backends.TimeoutEnvVar, backends.CallChecksEnvVar,
			accel.CheckReplicasEnvVar, accel.GradientCompressionEnvVar, cpu.GradientsEnvVar, cpu.MatmulEnvVar, cpu.ThreadsEnvVar}, name) || strings.HasPrefix(name, "OMPI_MCA_") {
			set = append(set, kv)
		}
	}
	if len(set) == 0 {
		return "(none of GOMLX_*, GOACCEL_*, PJRT_PLUGIN_LIBRARY_PATH, CUDA_VISIBLE_DEVICES, OPENBLAS_NUM_THREADS, " +
			"OMPI_MCA_* set)"
	}
	slices.Sort(set)
	return strings.Join(set, " ")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}
