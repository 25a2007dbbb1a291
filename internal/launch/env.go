package launch

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// forwardedPrefixes and forwardedNames say which variables of the launcher's environment reach every
// process of a job, on every host: goaccel's, GoMLX's and PJRT's settings, and the GPUs a process may see.
// Open MPI starts the processes of other hosts through ssh with the remote login's environment, and passes
// only the variables mpirun names with -x; processes on the launching host inherit mpirun's whole
// environment, so a job tried on one host does not notice what the others lack.
var (
	forwardedPrefixes = []string{"GOACCEL_", "GOMLX_", "PJRT_"}
	forwardedNames    = []string{"CUDA_VISIBLE_DEVICES"}
)

// WithForwardEnv passes more variables to every process of the job, on every host: NAME forwards the
// launcher's value (it must be set), NAME=VALUE sets it for the job and forwards it. Without it, Open MPI
// jobs forward (-x NAME, sorted, once each, on one host too) every variable that is set whose name starts
// with GOACCEL_, GOMLX_ or PJRT_, and CUDA_VISIBLE_DEVICES: Open MPI starts the processes of other hosts
// with the remote login's environment and passes only what mpirun names. MPICH's Hydra passes the whole
// environment by itself.
func WithForwardEnv(vars ...string) Option {
	return func(c *config) { c.forward = append(c.forward, vars...) }
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// forwarded returns the names to forward with -x, sorted and without duplicates: the default set, the restart count under
// WithMaxRestarts, and WithForwardEnv's, less those the extra mpirun arguments already pass with -x.
func (c *config) forwarded() ([]string, error) {
	set := map[string]bool{}
	for _, kv := range c.environ {
		name, _, ok := strings.Cut(kv, "=")
		if ok && (slices.Contains(forwardedNames, name) ||
			slices.ContainsFunc(forwardedPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })) {
			set[name] = true
		}
	}
	if c.maxRestarts > 0 {
		set[RestartCountEnvVar] = true
	}
	for _, v := range c.forward {
		name, _, assigns := strings.Cut(v, "=")
		if !envName.MatchString(name) {
			return nil, fmt.Errorf("launch: cannot forward %q: write NAME or NAME=VALUE, NAME of letters, digits and '_'", v)
		}
		if _, ok := c.lookupEnv(name); !ok && !assigns {
			return nil, fmt.Errorf("launch: cannot forward %s: it is not set in the launcher's environment "+
				"(set it, or give %s=VALUE)", name, name)
		}
		set[name] = true
	}
	for i, a := range c.extra {
		if a == "-x" && i+1 < len(c.extra) {
			name, _, _ := strings.Cut(c.extra[i+1], "=")
			delete(set, name)
		}
	}
	names := make([]string, 0, len(set))
	for name := range set {
		names = append(names, name)
	}
	slices.Sort(names)
	return names, nil
}

// assignForwarded sets WithForwardEnv's NAME=VALUE pairs in the job's environment.
func (c *config) assignForwarded() {
	for _, v := range c.forward {
		if name, _, assigns := strings.Cut(v, "="); assigns && envName.MatchString(name) {
			c.environ = append(slices.Clip(c.environ), v)
		}
	}
}
