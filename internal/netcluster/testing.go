package netcluster

import (
	"os"
	"testing"
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

// Require skips t, saying why, when clusters cannot be built here, or fails it when CI=true.
func Require(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: emulated clusters are required here)", err)
		}
		t.Skip(err)
	}
}
