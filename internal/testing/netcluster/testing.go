package netcluster

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

// ForTest builds a cluster for t and removes it when t ends, whether it passed, failed or panicked. Where
// clusters cannot be built (not root, no iproute2) it skips t saying why, except with CI=true, where that
// fails t: CI must run the tests that need a network. It first sweeps what clusters of killed test
// binaries left behind.
func ForTest(t testing.TB, hosts int, opts ...Option) *Cluster {
	t.Helper()
	Require(t)
	if err := Sweep(); err != nil {
		t.Logf("netcluster: sweeping clusters left by dead processes: %v", err)
	}
	c, err := New(hosts, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("netcluster: removing cluster %s: %v", c.ID, err)
		}
	})
	return c
}

// Require skips t, saying why, when clusters cannot be built here, or fails it when CI=true. Under -short
// (make test-fast) it skips: emulated clusters are the slow tier, which make test runs.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("an emulated cluster of hosts: the slow tier (make test-slow)")
	}
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: emulated clusters are required here)", err)
		}
		t.Skip(err)
	}
}

// Run runs name with args on host as Command does, waits for it and returns its exit code and output. A
// command that has not ended after limit is killed and fails t, as does one that cannot be started.
func (c *Cluster) Run(t testing.TB, host int, limit time.Duration, name string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := c.Command(ctx, host, name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	// Processes left on other hosts may hold the output open; the cluster's Close kills them.
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("netcluster: %s %q on host %d did not end within %s:\nstdout: %s\nstderr: %s", name, args, host, limit,
			&out, &errOut)
	}
	if err != nil && !errors.As(err, new(*exec.ExitError)) {
		t.Fatalf("netcluster: %s %q on host %d: %v\nstderr: %s", name, args, host, err, &errOut)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}
