package launch

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withPlaces fixes where host names are for the duration of a test: names listed in self are this machine
// and mpirun takes them for itself, those in loopback are this machine and mpirun does not, any other is
// another machine.
func withPlaces(t *testing.T, self, loopback []string) {
	saved := placeHost
	placeHost = func(name string) hostPlace {
		switch {
		case slices.Contains(self, name):
			return hostPlace{here: true, mpirunSelf: true}
		case slices.Contains(loopback, name):
			return hostPlace{here: true}
		}
		return hostPlace{}
	}
	t.Cleanup(func() { placeHost = saved })
}

// TestPlaceOf: the names mpirun takes for itself are localhost, this machine's name and the names of its
// interfaces' addresses (127.0.0.1 is the loopback interface's); another loopback address is this machine
// too, but mpirun starts a daemon for it; an address of no interface and no loopback is another machine.
func TestPlaceOf(t *testing.T) {
	self, err := os.Hostname()
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		want hostPlace
	}{
		{"localhost", hostPlace{here: true, mpirunSelf: true}},
		{self, hostPlace{here: true, mpirunSelf: true}},
		{"127.0.0.1", hostPlace{here: true, mpirunSelf: true}},
		{"127.0.0.2", hostPlace{here: true}},
		{"127.0.0.3", hostPlace{here: true}},
		{"203.0.113.7", hostPlace{}}, // TEST-NET-3: no machine's
		{"node7.invalid", hostPlace{}},
	} {
		assert.Equal(t, tc.want, placeOf(tc.name), tc.name)
	}
}

// TestSeveralHostsOnThisMachine: hosts that are all this machine, under two or more Open MPI nodes (mpirun
// itself and a daemon, or two daemons), get the TCP transport on the loopback network, unless the user
// chose the transport or the network; names mpirun merges into itself change nothing but get a notice; one
// name of this machine among other hosts, or another MPI, changes nothing.
func TestSeveralHostsOnThisMachine(t *testing.T) {
	withSingleCopy(t, true)
	withPlaces(t, []string{"localhost", "127.0.0.1", "vm"}, []string{"127.0.0.2", "127.0.0.3"})
	base := []Option{WithFlavor(OpenMPI), WithRunAsRoot(false), WithCPUs(2), WithEnviron([]string{})}
	tcp := []string{"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "127.0.0.0/8",
		"--mca", "oob_tcp_if_include", "127.0.0.0/8"}
	tests := []struct {
		name       string
		opts       []Option
		want       []string // the words between --bind-to none and the program
		wantNotice string
	}{
		{
			name:       "mpirun itself and a daemon",
			opts:       []Option{WithHosts(Host{"127.0.0.1", 2}, Host{"127.0.0.2", 2})},
			want:       tcp,
			wantNotice: "hosts 127.0.0.1 and 127.0.0.2 both name this machine (",
		},
		{
			name:       "two daemons",
			opts:       []Option{WithHosts(Host{"127.0.0.2", 1}, Host{"127.0.0.3", 1})},
			want:       tcp,
			wantNotice: "mpirun starts a daemon for each of 127.0.0.2 and 127.0.0.3: Open MPI's shared memory cannot join",
		},
		{
			name: "names mpirun merges: one host, as before",
			opts: []Option{WithHosts(Host{"localhost", 2}, Host{"127.0.0.1", 2})},
			wantNotice: "hosts localhost and 127.0.0.1 both name this machine (vm), and mpirun takes each for itself: " +
				"it runs their processes (4 slots) as one host",
		},
		{
			name:       "the user's network",
			opts:       []Option{WithHosts(Host{"localhost", 1}, Host{"127.0.0.2", 1}), WithNetwork("lo")},
			want:       []string{"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"},
			wantNotice: "each of localhost (mpirun itself) and 127.0.0.2",
		},
		{
			name: "the user's transports",
			opts: []Option{WithHosts(Host{"localhost", 2}, Host{"127.0.0.2", 2}),
				WithMPIRunArgs("--mca", "btl", "self,vader,tcp")},
			want: []string{"--mca", "btl_tcp_if_include", "127.0.0.0/8", "--mca", "oob_tcp_if_include", "127.0.0.0/8",
				"--mca", "btl", "self,vader,tcp"},
			wantNotice: "you chose the transports (btl self,vader,tcp): with a shared-memory one among them (vader, sm) " +
				"a rank may crash with SIGSEGV; --mca btl self,tcp works",
		},
		{
			name: "the user's interfaces, in the environment",
			opts: []Option{WithHosts(Host{"localhost", 2}, Host{"127.0.0.2", 2}),
				WithEnviron([]string{"OMPI_MCA_btl_tcp_if_exclude=docker0", "OMPI_MCA_oob_tcp_if_include=eth0"})},
			want:       []string{"--mca", "btl", "self,tcp"},
			wantNotice: "so they talk over TCP (--mca btl self,tcp)",
		},
		{
			name:       "with hosts of other machines: TCP on their network",
			opts:       []Option{WithHosts(Host{"vm", 2}, Host{"127.0.0.2", 2}, Host{"node2", 4})},
			want:       []string{"--mca", "btl", "self,tcp"},
			wantNotice: "hosts vm and 127.0.0.2 both name this machine",
		},
		{
			name:       "from a hostfile",
			opts:       []Option{WithHostfile(writeFile(t, "127.0.0.2 slots=2\n127.0.0.3 slots=2\n"))},
			want:       tcp,
			wantNotice: "hosts 127.0.0.2 and 127.0.0.3 both name this machine",
		},
		{name: "one name of this machine and another machine", opts: []Option{WithHosts(Host{"127.0.0.2", 2}, Host{"node2", 2})}},
		{name: "this machine alone"},
		{name: "MPICH", opts: []Option{WithFlavor(MPICH), WithHosts(Host{"127.0.0.2", 1}, Host{"127.0.0.3", 1})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var notices []string
			opts := append(append(base[:len(base):len(base)], tt.opts...), WithNotice(func(n string) { notices = append(notices, n) }))
			argv, err := Argv(0, "./train", nil, opts...)
			require.NoError(t, err)
			var got []string
			if i := slices.Index(argv, "none"); i >= 0 && i+1 < len(argv)-1 {
				got = argv[i+1 : len(argv)-1]
			}
			assert.Equal(t, tt.want, got, "%s", String(argv))
			if tt.wantNotice == "" {
				assert.Empty(t, notices)
				return
			}
			require.Len(t, notices, 1, "told once")
			assert.Contains(t, notices[0], tt.wantNotice)
		})
	}
}

func writeFile(t *testing.T, text string) string {
	path := filepath.Join(t.TempDir(), "hosts")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

// TestRunSaysSeveralHostsAreThisMachine: Run writes the notice to the job's standard error once, however
// many times the job restarts, and probes through the launch agent the names of this machine that mpirun
// reaches through it (127.0.0.2), not those it takes for itself (localhost).
func TestRunSaysSeveralHostsAreThisMachine(t *testing.T) {
	dir, mpirun, ssh := fakeLauncher(t)
	var out bytes.Buffer
	code, err := Run(context.Background(), 0, "./train", nil, WithMPIRun(mpirun), WithLaunchAgent(ssh),
		WithHosts(Host{"localhost", 1}, Host{"127.0.0.2", 1}), WithEnviron([]string{"PATH=" + os.Getenv("PATH")}),
		WithStdio(nil, &out, &out), WithMaxRestarts(2))
	require.NoError(t, err, out.String())
	require.Equal(t, 0, code, out.String())
	assert.Equal(t, 1, strings.Count(out.String(), "launch: hosts localhost and 127.0.0.2 both name this machine"), out.String())
	probes, err := os.ReadFile(filepath.Join(dir, "ssh.ran"))
	require.NoError(t, err)
	assert.Equal(t, "-o BatchMode=yes -- 127.0.0.2 true\n", string(probes))
	ran, err := os.ReadFile(filepath.Join(dir, "mpirun.ran"))
	require.NoError(t, err)
	assert.Contains(t, string(ran), "--mca btl self,tcp --mca btl_tcp_if_include 127.0.0.0/8 --mca oob_tcp_if_include 127.0.0.0/8")
}
