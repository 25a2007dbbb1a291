package launch

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckLocalNetwork: a WithNetwork value of which no part is an interface of this machine, or a subnet
// one of its addresses is in, is refused naming the machine's interfaces; one part found is enough.
func TestCheckLocalNetwork(t *testing.T) {
	saved := localInterfaces
	t.Cleanup(func() { localInterfaces = saved })
	localInterfaces = func() ([]localInterface, error) {
		return []localInterface{
			{name: "lo", addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
			{name: "eth0", addrs: []netip.Prefix{netip.MustParsePrefix("10.1.2.3/24"), netip.MustParsePrefix("fd00::2/64")}},
			{name: "ifb0"},
		}, nil
	}
	const interfaces = "its interfaces are lo (127.0.0.1/8), eth0 (10.1.2.3/24, fd00::2/64), ifb0 (no address)"
	for _, tc := range []struct{ network, want string }{
		{"eth0", ""},
		{"10.1.2.0/24", ""},
		{"10.0.0.0/8", ""},
		{"fd00::/64", ""},
		{"nonexist0, 10.1.0.0/16", ""},
		{"nonexist0", `network "nonexist0": this machine has no interface of this name, and mpirun, which runs here, ` +
			"makes its control connections on it (oob_tcp_if_include); " + interfaces},
		{"10.213.0.0/24", `network "10.213.0.0/24": this machine has no address in this subnet`},
		{"nonexist0,ib9", `network "nonexist0,ib9": this machine has none of these interfaces or subnets`},
		{"10.0.0.0/33", "is not a subnet"},
	} {
		err := checkLocalNetwork(tc.network)
		if tc.want == "" {
			assert.NoError(t, err, tc.network)
			continue
		}
		require.Error(t, err, tc.network)
		assert.Contains(t, err.Error(), tc.want)
	}
	// The real machine: a name no machine has.
	localInterfaces = saved
	require.ErrorContains(t, checkLocalNetwork("goaccel-none0"), "no interface of this name")
	require.NoError(t, checkLocalNetwork("127.0.0.0/8"), "loopback")
}

// TestRunRefusesAMissingNetworkBeforeMPIRun: Run with a network this machine lacks fails before mpirun
// starts, with the launcher's sentence instead of mpirun's banners.
func TestRunRefusesAMissingNetworkBeforeMPIRun(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	mpirun := filepath.Join(dir, "mpirun")
	require.NoError(t, os.WriteFile(mpirun, []byte("#!/bin/sh\necho ran > '"+marker+"'\n"), 0o755))
	_, err := Run(context.Background(), 1, "true", nil, WithMPIRun(mpirun), WithFlavor(OpenMPI),
		WithNetwork("goaccel-none0"), WithStdio(nil, nil, nil))
	require.ErrorContains(t, err, `launch: network "goaccel-none0": this machine has no interface of this name`)
	assert.NoFileExists(t, marker, "mpirun ran")
}
