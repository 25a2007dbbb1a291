// Package cpu chooses and prepares GoMLX's compute backend for a goaccel process: the pure-Go backend
// unless XLA is asked for or already installed, never a plugin download at run time, one GPU per local rank.
//
// goaccel's own CPU kernels for the pure-Go backend (matrix products on BLAS, convolutions, fused
// element-wise chains, row gathers, gemm-shaped gradients) live in package cpu/kernels, which registers
// itself here the way an MPI engine registers with package backends: import it for its side effect
// (package accel does). Without it, or on a GoMLX other than the one the kernels were written against,
// New returns GoMLX's backend as shipped.
package cpu

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
)

// Config selects the GoMLX compute backend.
type Config struct {
	// Backend is a GoMLX backend configuration such as "go", "xla:cpu" or "xla:cuda". Empty means: XLA if a
	// PJRT plugin is already installed, else the pure-Go backend.
	Backend string
	// BackendSource says what asked for Backend, for messages: empty for a program's option, else the
	// environment variable it came from (accel's configuration sets it for GOMLX_BACKEND).
	BackendSource string
	// AllowDownloads lets GoMLX download PJRT plugins at run time. Off by default: a training job should not
	// depend on the network, and without one the download makes backend creation fail or panic.
	AllowDownloads bool
	// LocalRank and LocalSize place the process on the GPU of its local rank when several ranks share a node,
	// and give it its share of the node's cores for BLAS threads.
	LocalRank, LocalSize int
	// Threads overrides the compute threads of this process (default: cores / LocalSize; ThreadsEnvVar in
	// accel's configuration): its BLAS threads, and with 1 the pure-Go backend runs a graph's operations one
	// after another.
	Threads int
	// Gradients is "gemm" (the default when empty) or "gomlx", and Matmul "blas" (the default when empty)
	// or "go": see GradientsEnvVar and MatmulEnvVar, which accel's configuration reads into them.
	Gradients, Matmul string
	// Convolutions is "kernel" (the default when empty) or "graph": see ConvEnvVar, which accel's
	// configuration reads into it.
	Convolutions string
	// VisibleDevices is the CUDA_VISIBLE_DEVICES the process started with (accel's configuration reads it):
	// with several local ranks, each keeps the device of its local rank.
	VisibleDevices string
}

// PureGo is the GoMLX configuration of the pure-Go backend: no cgo, no plugin, no network.
const PureGo = simplego.BackendName

// Resolve returns the GoMLX backend configuration that New would use, and why.
func Resolve(cfg Config) (config, reason string) {
	if cfg.Backend != "" {
		if cfg.BackendSource != "" {
			return cfg.Backend, "requested by " + cfg.BackendSource
		}
		return cfg.Backend, "requested by option"
	}
	xlaMu.Lock()
	defer xlaMu.Unlock()
	configureDownloads(cfg.AllowDownloads)
	if plugins := installedPlugins(); len(plugins) > 0 {
		return "xla:" + plugins[0], "PJRT plugin installed"
	}
	return PureGo, "default (no PJRT plugin installed)"
}

var (
	// xlaMu serialises goaccel's use of package xla's process-wide state: EnableAutoInstall writes a plain
	// variable that GetAvailablePlugins and xla.New read, and GetAvailablePlugins rewrites its cached list
	// of plugins whenever none was found. In-process ranks each call New at once; without the lock, those
	// calls race (GoMLX v0.26.0 synchronises none of it).
	xlaMu sync.Mutex
	// downloadsConfigured and downloadsAllowed are the setting configureDownloads made last.
	downloadsConfigured, downloadsAllowed bool
)

// configureDownloads lets GoMLX download PJRT plugins or not. It changes the process-wide setting only when
// it differs from the one it made last, so that New, called by every rank of a process, rewrites nothing
// once the setting is made. Called with xlaMu held.
func configureDownloads(allow bool) {
	if !allow && os.Getenv(noAutoInstallEnv) != "1" {
		// Both: the variable for any code that creates backends on its own, and the call because GoMLX reads
		// the variable only once, at package initialisation.
		_ = os.Setenv(noAutoInstallEnv, "1")
	}
	if downloadsConfigured && downloadsAllowed == allow {
		return
	}
	enablePluginDownloads(allow)
	downloadsConfigured, downloadsAllowed = true, allow
}

var (
	backendMu sync.Mutex
	// backendByConfig holds one backend per configuration: GoMLX tensors cannot move between backend
	// instances, so every Accelerator of a process (in-process ranks included) shares one.
	backendByConfig = map[string]backends.Backend{}
)

// New returns the GoMLX compute backend for this process, creating it on first use, and sets up goaccel's
// compute paths (see Kernels): gemm-shaped gradients, and for the pure-Go backend the BLAS matmul with
// this rank's share of the node's cores. A backend that cannot start returns an error naming it and what
// is missing; GoMLX's own panics are recovered.
func New(cfg Config) (backends.Backend, error) {
	xlaMu.Lock()
	configureDownloads(cfg.AllowDownloads)
	xlaMu.Unlock()
	config, reason := Resolve(cfg)
	config, err := scheduleOps(cfg, config)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	backendMu.Lock()
	defer backendMu.Unlock()
	// The convolution form decides which wrapper the backend gets, so it is part of the key.
	key := fmt.Sprintf("%s|conv=%s", config, cmp.Or(cfg.Convolutions, "kernel"))
	backend, ok := backendByConfig[key]
	if !ok {
		var err error
		if backend, err = newBackend(cfg, config, reason); err != nil {
			return nil, err
		}
		backendByConfig[key] = backend
	}
	name, options, _ := strings.Cut(config, ":")
	if err := applyKernels(cfg, name); err != nil {
		return nil, err
	}
	if name == PureGo {
		setOpsSchedule(options)
	}
	return backend, nil
}

// sequentialOps is the pure-Go backend's option that runs a graph's operations one after another.
const sequentialOps = "ops_sequential"

// scheduleOps chooses how the pure-Go backend schedules a graph's operations when the configuration leaves
// it to the backend (a bare "go"). By default the backend runs independent operations on parallel
// goroutines whenever one graph executes alone; with a single core for this process — ranks sharing a node
// get cores ÷ local ranks, as for BLAS threads — those goroutines cannot run at once, and their hand-overs
// cost more than they overlap: the demo's MLP trained 20% slower per epoch on 2 ranks of a 2-core machine
// (0.65 s against 0.53 s), while its CNN gained nothing. With more cores the backend's own choice stands.
//
// With GOACCEL_MATMUL=go the matrix products are simplego's own, whose DotGeneral waits for workers of the
// backend's pool from inside a pool worker: with operations in parallel, products running at once can fill
// the pool and wait for each other forever (GoMLX v0.26.0; docs/notes.md, Note [simplego's worker pool]).
// Operations then run one after another, so no wait ever holds a worker that another task needs.
//
// In a binary built with the race detector, operations run one after another too: the backend's parallel
// scheduler reads its count of each result's consumers outside the lock under which it writes it, which the
// detector reports in every graph with a result used twice, together with the in-place writes that count
// allows (GoMLX v0.26.0; docs/notes.md, Note [simplego's parallel scheduler]). Sequential operations leave
// the detector free to report goaccel's own races.
func scheduleOps(cfg Config, config string) (string, error) {
	if config != PureGo {
		return config, nil // another backend, or options the user chose
	}
	if cfg.Matmul == "go" || raceDetector {
		return PureGo + ":" + sequentialOps, nil
	}
	if cfg.ThreadBudget() > 1 {
		return config, nil
	}
	return PureGo + ":" + sequentialOps, nil
}

// SequentialPureGo is the configuration of GoMLX's pure-Go backend that runs a graph's operations one after
// another: what scheduleOps chooses where the backend's parallel scheduler would cost more than it gives, or
// could wait forever (see scheduleOps).
const SequentialPureGo = PureGo + ":" + sequentialOps

func newBackend(cfg Config, config, reason string) (backend backends.Backend, err error) {
	name, _, _ := strings.Cut(config, ":")
	if name == "xla" {
		if devices, ok := visibleDeviceForRank(cfg.VisibleDevices, cfg.LocalRank, cfg.LocalSize); ok {
			_ = os.Setenv("CUDA_VISIBLE_DEVICES", devices)
		}
	}
	defer func() {
		if r := recover(); r != nil {
			backend, err = nil, fmt.Errorf("compute: backend %q (%s) failed to start: %v", config, reason, r)
		}
	}()
	backend, err = newGoMLXBackend(config)
	if err != nil {
		hint := ""
		if name == "xla" {
			hint = "; XLA needs a PJRT plugin (set PJRT_PLUGIN_LIBRARY_PATH, or opt in to downloads) — " +
				"or use the pure-Go backend with GOMLX_BACKEND=go"
		}
		return nil, fmt.Errorf("compute: backend %q (%s) failed to start: %w%s", config, reason, err, hint)
	}
	if name == PureGo {
		return wrapPureGo(cfg, backend)
	}
	return backend, nil
}

// newGoMLXBackend creates the backend GoMLX makes for config, with xlaMu held: xla.New reads the
// auto-install setting and the plugin list that Resolve and configureDownloads write.
func newGoMLXBackend(config string) (backends.Backend, error) {
	xlaMu.Lock()
	defer xlaMu.Unlock()
	return backends.NewWithConfig(config)
}

// visibleDeviceForRank chooses CUDA_VISIBLE_DEVICES for the process of local rank r among localSize: one GPU
// per process, seen as its device 0. Unset means every GPU of the node is visible, so rank r takes GPU r.
// Schedulers often expose all of a node's GPUs to every task (SLURM's --gpus-per-node): a list with one
// entry per local rank is narrowed to this rank's entry. Anything else (one entry, a list that does not
// match the ranks) is the user's choice and is left alone.
func visibleDeviceForRank(current string, localRank, localSize int) (string, bool) {
	if localSize <= 1 {
		return "", false
	}
	if current == "" {
		return strconv.Itoa(localRank), true
	}
	list := strings.Split(current, ",")
	if len(list) == localSize && localRank < len(list) {
		return strings.TrimSpace(list[localRank]), true
	}
	return "", false
}

// IsPureGo reports whether backend is GoMLX's pure-Go backend, wrapped by goaccel's kernels or not.
func IsPureGo(backend backends.Backend) bool {
	return backend != nil && backend.Name() == (*simplego.Backend)(nil).Name()
}
