package backends

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/backends/xla"
)

// ComputeConfig selects the GoMLX compute backend.
type ComputeConfig struct {
	// Backend is a GoMLX backend configuration such as "go", "xla:cpu" or "xla:cuda". Empty means: the
	// GOMLX_BACKEND environment variable if set, else XLA if a PJRT plugin is already installed, else the
	// pure-Go backend.
	Backend string
	// AllowDownloads lets GoMLX download PJRT plugins at run time. Off by default: a training job should not
	// depend on the network, and without one the download makes backend creation fail or panic.
	AllowDownloads bool
	// LocalRank and LocalSize place the process on the GPU of its local rank when several ranks share a node.
	LocalRank, LocalSize int
}

// PureGoBackend is the GoMLX configuration of the pure-Go backend: no cgo, no plugin, no network.
const PureGoBackend = simplego.BackendName

// ResolveComputeBackend returns the GoMLX backend configuration that NewCompute would use, and why.
func ResolveComputeBackend(cfg ComputeConfig) (config, reason string) {
	if cfg.Backend != "" {
		return cfg.Backend, "requested by option"
	}
	if env := os.Getenv(gomlxbackends.ConfigEnvVar); env != "" {
		return env, "requested by " + gomlxbackends.ConfigEnvVar
	}
	configureDownloads(cfg.AllowDownloads)
	if plugins := xla.GetAvailablePlugins(); len(plugins) > 0 {
		return "xla:" + plugins[0], "PJRT plugin installed"
	}
	return PureGoBackend, "default (no PJRT plugin installed)"
}

func configureDownloads(allow bool) {
	if !allow {
		// Both: the variable for any code that creates backends on its own, and the call because GoMLX reads
		// the variable only once, at package initialisation.
		_ = os.Setenv(xla.NoAutoInstallEnv, "1")
	}
	xla.EnableAutoInstall(allow)
}

var (
	computeMu sync.Mutex
	// computeByConfig holds one backend per configuration: GoMLX tensors cannot move between backend
	// instances, so every Accelerator of a process (in-process ranks included) shares one.
	computeByConfig = map[string]gomlxbackends.Backend{}
)

// NewCompute returns the GoMLX compute backend for this process, creating it on first use. A backend that
// cannot start returns an error naming it and what is missing; GoMLX's own panics are recovered.
func NewCompute(cfg ComputeConfig) (gomlxbackends.Backend, error) {
	configureDownloads(cfg.AllowDownloads)
	config, reason := ResolveComputeBackend(cfg)
	computeMu.Lock()
	defer computeMu.Unlock()
	if backend, ok := computeByConfig[config]; ok {
		return backend, nil
	}
	backend, err := newCompute(cfg, config, reason)
	if err == nil {
		computeByConfig[config] = backend
	}
	return backend, err
}

func newCompute(cfg ComputeConfig, config, reason string) (backend gomlxbackends.Backend, err error) {
	name, _, _ := strings.Cut(config, ":")
	if name == "xla" && cfg.LocalSize > 1 && os.Getenv("CUDA_VISIBLE_DEVICES") == "" {
		// One GPU per process: the process of local rank r sees only GPU r, as its device 0.
		_ = os.Setenv("CUDA_VISIBLE_DEVICES", strconv.Itoa(cfg.LocalRank))
	}
	defer func() {
		if r := recover(); r != nil {
			backend, err = nil, fmt.Errorf("backends: compute backend %q (%s) failed to start: %v", config, reason, r)
		}
	}()
	backend, err = gomlxbackends.NewWithConfig(config)
	if err != nil {
		hint := ""
		if name == "xla" {
			hint = "; XLA needs a PJRT plugin (set PJRT_PLUGIN_LIBRARY_PATH, or opt in to downloads) — " +
				"or use the pure-Go backend with GOMLX_BACKEND=go"
		}
		return nil, fmt.Errorf("backends: compute backend %q (%s) failed to start: %w%s", config, reason, err, hint)
	}
	return backend, nil
}
