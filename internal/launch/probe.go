package launch

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultProbeTimeout bounds the probe of each host before a job on several hosts starts (WithHostProbe).
const DefaultProbeTimeout = 30 * time.Second

// WithHostProbe sets how long Run and Check wait for each other host to answer before a job on several
// hosts starts (DefaultProbeTimeout by default; 0 or less: no probe). As horovodrun does, the launcher runs
// `AGENT HOST true` on every host but its own, at once, with the launch agent mpirun would use (ssh unless
// WithLaunchAgent, --mca plm_rsh_agent or OMPI_MCA_plm_rsh_agent names another): a host that cannot be
// resolved or reached, or refuses the login, fails the launch with a *HostError naming it, where mpirun
// would only say that it "was unable to reliably start one or more daemons". Jobs inside a Slurm
// allocation are not probed: Open MPI starts them through Slurm.
func WithHostProbe(timeout time.Duration) Option { return func(c *config) { c.probeTimeout = timeout } }

// HostError says that a host of the job cannot take part in it: the launcher's probe could not reach it,
// or mpirun reported that its daemon could not be started or could not connect.
type HostError struct {
	// Host is the host's name; empty when mpirun said that a daemon failed without saying where.
	Host string
	// Reason says what went wrong, in words; Err is the underlying error, if any.
	Reason string
	Err    error
}

func (e *HostError) Error() string {
	if e.Host == "" {
		return "launch: " + e.Reason
	}
	return fmt.Sprintf("launch: host %s: %s", e.Host, e.Reason)
}

func (e *HostError) Unwrap() error { return e.Err }

// probeHosts runs the launch agent's `true` on every host of the job that is not this one, in parallel,
// and returns a *HostError for each that did not answer in time (joined). Its host names were checked
// (checkHostName): none starts with '-'.
func (c *config) probeHosts(ctx context.Context) error {
	// Inside an allocation Open MPI starts its daemons through Slurm, whatever the hosts.
	if c.probeTimeout <= 0 || c.flavor == UnknownFlavor || c.inSlurm() {
		return nil
	}
	hosts, err := c.jobHosts()
	if err != nil {
		return err
	}
	var names []string
	for _, h := range hosts {
		names = append(names, h.Name)
	}
	if c.hostfile != "" {
		fileHosts, err := readHostfile(c.hostfile)
		if err != nil {
			return err
		}
		names = names[:0]
		for _, h := range fileHosts {
			names = append(names, h.Name)
		}
	}
	// A hostfile may name a host on several lines; it is probed once.
	seen := map[string]bool{}
	names = slices.DeleteFunc(names, func(name string) bool {
		probed := seen[name]
		seen[name] = true
		// mpirun starts no daemon for a name it takes for itself; any other, this machine or not, it reaches
		// through the agent (see placeOf).
		return probed || placeHost(name).mpirunSelf
	})
	if len(names) == 0 {
		return nil
	}
	agent := strings.Fields(c.launchAgent())
	if len(agent) == 0 {
		return nil
	}
	if _, err := exec.LookPath(agent[0]); err != nil {
		return &HostError{Host: names[0], Err: err, Reason: fmt.Sprintf("cannot be reached: the launch agent %q is not "+
			"installed here (mpirun starts its daemons on other hosts with it; name another with WithLaunchAgent, "+
			"accel launch --launch-agent)", agent[0])}
	}
	if filepath.Base(agent[0]) == "ssh" && !slices.ContainsFunc(agent, func(a string) bool { return strings.Contains(a, "BatchMode") }) {
		// A password prompt would wait for the timeout; mpirun cannot answer one either.
		agent = append(agent, "-o", "BatchMode=yes")
	}
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { errs[i] = probeHost(ctx, agent, name, c.probeTimeout) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// launchAgent is the command mpirun starts its remote daemons with: WithLaunchAgent's, else the extra
// arguments' or the environment's plm_rsh_agent, else Open MPI's default "ssh : rsh". As Open MPI does, a
// list of alternatives separated by ':' gives the first one installed.
func (c *config) launchAgent() string {
	agent := c.agent
	for i, a := range c.extra {
		if agent == "" && (a == "--mca" || a == "-mca") && i+2 < len(c.extra) && c.extra[i+1] == "plm_rsh_agent" {
			agent = c.extra[i+2]
		}
	}
	agent = cmp.Or(agent, c.env("OMPI_MCA_plm_rsh_agent"), c.env("OMPI_MCA_orte_rsh_agent"), "ssh : rsh")
	alternatives := strings.Split(agent, ":")
	for _, alt := range alternatives {
		if words := strings.Fields(alt); len(words) > 0 {
			if _, err := exec.LookPath(words[0]); err == nil {
				return strings.TrimSpace(alt)
			}
		}
	}
	return strings.TrimSpace(alternatives[0])
}

// probeArgv is the command that probes host through the launch agent: AGENT HOST true, and for ssh
// AGENT -- HOST true, so that ssh reads HOST as its destination whatever it holds.
func probeArgv(agent []string, host string) []string {
	argv := slices.Clone(agent)
	if filepath.Base(argv[0]) == "ssh" && argv[len(argv)-1] != "--" {
		argv = append(argv, "--")
	}
	return append(argv, host, "true")
}

func probeHost(ctx context.Context, agent []string, host string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	argv := probeArgv(agent, host)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// No terminal to ask a password on; the agent's own children go with it on timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	if err == nil {
		return nil
	}
	said := strings.TrimSpace(out.String())
	if said != "" {
		said = ": " + said
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("no answer within %s", timeout)
	}
	return &HostError{Host: host, Err: err, Reason: fmt.Sprintf("cannot be reached through the launch agent: `%s` "+
		"failed after %s: %v%s", String(argv), time.Since(start).Round(time.Millisecond), err, said)}
}
