package launch

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withSingleCopy fixes the CMA probe for the duration of a test.
func withSingleCopy(t *testing.T, works bool) {
	saved := probeSingleCopy
	probeSingleCopy = func() (bool, string) { return works, "refused by the test" }
	t.Cleanup(func() { probeSingleCopy = saved })
}

func TestArgv(t *testing.T) {
	// Fixed machine: Open MPI, root, 2 cores, single copy available (no default MCA parameters).
	base := []Option{WithFlavor(OpenMPI), WithRunAsRoot(true), WithCPUs(2), WithEnviron([]string{})}
	tests := []struct {
		name    string
		procs   int
		opts    []Option
		noCMA   bool
		program string
		args    []string
		want    []string
	}{
		{
			name: "as root within the cores", procs: 2, program: "./train", args: []string{"-epochs", "3"},
			want: []string{"mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "none", "./train", "-epochs", "3"},
		},
		{
			name: "not root", procs: 2, opts: []Option{WithRunAsRoot(false)}, program: "./train",
			want: []string{"mpirun", "-np", "2", "--bind-to", "none", "./train"},
		},
		{
			name: "more processes than cores", procs: 4, program: "./train",
			want: []string{"mpirun", "-np", "4", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "./train"},
		},
		{
			name: "a hostfile decides placement", procs: 8, opts: []Option{WithHostfile("hosts.txt")}, program: "./train",
			want: []string{"mpirun", "-np", "8", "--hostfile", "hosts.txt", "--allow-run-as-root", "--bind-to", "none", "./train"},
		},
		{
			name: "extra flags pass through and override defaults", procs: 4,
			opts:    []Option{WithMPIRunArgs("--bind-to", "core", "--oversubscribe", "-x", "NCCL_DEBUG")},
			program: "./train",
			want: []string{"mpirun", "-np", "4", "--allow-run-as-root",
				"--bind-to", "core", "--oversubscribe", "-x", "NCCL_DEBUG", "./train"},
		},
		{
			name: "binding policy from the environment", procs: 1,
			opts:    []Option{WithEnviron([]string{"OMPI_MCA_hwloc_base_binding_policy=core"})},
			program: "./train",
			want:    []string{"mpirun", "-np", "1", "--allow-run-as-root", "./train"},
		},
		{
			name: "explicit binding, MCA parameters and launcher", procs: 1,
			opts:    []Option{WithBindTo("socket"), WithMCA("btl", "self,vader"), WithMPIRun("/opt/ompi/bin/mpirun")},
			program: "./train",
			want: []string{"/opt/ompi/bin/mpirun", "-np", "1", "--allow-run-as-root", "--bind-to", "socket",
				"--mca", "btl", "self,vader", "./train"},
		},
		{
			name: "mpirun's own binding default", procs: 1, opts: []Option{WithBindTo("")}, program: "./train",
			want: []string{"mpirun", "-np", "1", "--allow-run-as-root", "./train"},
		},
		{
			name: "no cross-memory attach", procs: 2, noCMA: true, program: "./train",
			want: []string{"mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "none",
				"--mca", "btl_vader_single_copy_mechanism", "none", "./train"},
		},
		{
			name: "no cross-memory attach, but the environment decides", procs: 2, noCMA: true,
			opts:    []Option{WithEnviron([]string{"OMPI_MCA_btl_vader_single_copy_mechanism=cma"})},
			program: "./train",
			want:    []string{"mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "none", "./train"},
		},
		{
			name: "no cross-memory attach, but the extra flags decide", procs: 2, noCMA: true,
			opts:    []Option{WithMPIRunArgs("--mca", "btl_vader_single_copy_mechanism", "xpmem")},
			program: "./train",
			want: []string{"mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "none",
				"--mca", "btl_vader_single_copy_mechanism", "xpmem", "./train"},
		},
		{
			name: "no cross-memory attach, but WithMCA decides", procs: 2, noCMA: true,
			opts:    []Option{WithMCA("btl_vader_single_copy_mechanism", "cma")},
			program: "./train",
			want: []string{"mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "none",
				"--mca", "btl_vader_single_copy_mechanism", "cma", "./train"},
		},
		{
			name: "no cross-memory attach, defaults turned off", procs: 2, noCMA: true,
			opts: []Option{WithoutDefaultMCA()}, program: "./train",
			want: []string{"mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "none", "./train"},
		},
		{
			name: "MPICH needs none of Open MPI's flags", procs: 4, noCMA: true,
			opts:    []Option{WithFlavor(MPICH), WithHostfile("hosts"), WithMPIRunArgs("-ppn", "2")},
			program: "./train", args: []string{"--lr=0.1"},
			want: []string{"mpirun", "-np", "4", "-hostfile", "hosts", "-ppn", "2", "./train", "--lr=0.1"},
		},
		{
			name: "unknown MPI gets the bare command", procs: 4, opts: []Option{WithFlavor(UnknownFlavor)},
			program: "./train",
			want:    []string{"mpirun", "-np", "4", "./train"},
		},
		{
			name: "hosts: one process per slot by default, never --oversubscribe", procs: 0,
			opts:    []Option{WithHosts(Host{"node1", 4}, Host{"node2", 4})},
			program: "./train",
			want: []string{"mpirun", "-np", "8", "--host", "node1:4,node2:4", "--allow-run-as-root", "--bind-to", "none",
				"./train"},
		},
		{
			name: "hosts: fewer processes than slots", procs: 3,
			opts:    []Option{WithHosts(Host{"node1", 2}, Host{"node2", 2})},
			program: "./train",
			want: []string{"mpirun", "-np", "3", "--host", "node1:2,node2:2", "--allow-run-as-root", "--bind-to", "none",
				"./train"},
		},
		{
			name: "hosts passed through as mpirun words: no --oversubscribe either", procs: 4,
			opts:    []Option{WithMPIRunArgs("--host", "h0:2,h1:2")},
			program: "./train",
			want: []string{"mpirun", "-np", "4", "--allow-run-as-root", "--bind-to", "none", "--host", "h0:2,h1:2",
				"./train"},
		},
		{
			name: "a hostfile without a count leaves it to mpirun", procs: 0, opts: []Option{WithHostfile("hosts.txt")},
			program: "./train",
			want:    []string{"mpirun", "--hostfile", "hosts.txt", "--allow-run-as-root", "--bind-to", "none", "./train"},
		},
		{
			name: "this machine alone: one process by default", procs: 0, program: "./train",
			want: []string{"mpirun", "-np", "1", "--allow-run-as-root", "--bind-to", "none", "./train"},
		},
		{
			name: "network, launch agent, hosts", procs: 2,
			opts: []Option{WithHosts(Host{"h0", 1}, Host{"h1", 1}), WithNetwork("10.213.0.0/24"),
				WithLaunchAgent("/tmp/agent")},
			program: "./train",
			want: []string{"mpirun", "-np", "2", "--host", "h0:1,h1:1", "--allow-run-as-root", "--bind-to", "none",
				"--mca", "plm_rsh_agent", "/tmp/agent",
				"--mca", "btl_tcp_if_include", "10.213.0.0/24", "--mca", "oob_tcp_if_include", "10.213.0.0/24", "./train"},
		},
		{
			name: "network by interface names, agent with options", procs: 1,
			opts:    []Option{WithNetwork("eth0, ib0"), WithLaunchAgent("ssh -p 2222")},
			program: "./train",
			want: []string{"mpirun", "-np", "1", "--allow-run-as-root", "--bind-to", "none",
				"--mca", "plm_rsh_agent", "ssh -p 2222",
				"--mca", "btl_tcp_if_include", "eth0,ib0", "--mca", "oob_tcp_if_include", "eth0,ib0", "./train"},
		},
		{
			name: "environment: goaccel's, GoMLX's, PJRT's and the GPUs, sorted, only those set", procs: 1,
			opts: []Option{WithEnviron([]string{"PATH=/bin", "GOMLX_BACKEND=go", "GOACCEL_DEBUG=1", "HOME=/root",
				"PJRT_PLUGIN_LIBRARY_PATH=/opt", "CUDA_VISIBLE_DEVICES=0,1", "CUDA_HOME=/usr/local/cuda",
				"GOMLX_BACKEND=xla", "NOT_GOACCEL_X=1"})},
			program: "./train",
			want: []string{"mpirun", "-np", "1", "--allow-run-as-root", "--bind-to", "none",
				"-x", "CUDA_VISIBLE_DEVICES", "-x", "GOACCEL_DEBUG", "-x", "GOMLX_BACKEND", "-x", "PJRT_PLUGIN_LIBRARY_PATH",
				"./train"},
		},
		{
			name: "environment: more by name, the restart count once, none the mpirun words forward", procs: 2,
			opts: []Option{WithEnviron([]string{"GOACCEL_RESTART_COUNT=0", "GOMLX_BACKEND=go", "OMP_NUM_THREADS=2"}),
				WithForwardEnv("OMP_NUM_THREADS", "NCCL_DEBUG=INFO", "OMP_NUM_THREADS"), WithMaxRestarts(2),
				WithMPIRunArgs("-x", "GOMLX_BACKEND")},
			program: "./train",
			want: []string{"mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "none",
				"-x", "GOACCEL_RESTART_COUNT", "-x", "NCCL_DEBUG", "-x", "OMP_NUM_THREADS", "-x", "GOMLX_BACKEND", "./train"},
		},
		{
			name: "MPICH: hosts, agent and interface; the environment passes by default", procs: 0,
			opts: []Option{WithFlavor(MPICH), WithHosts(Host{"node1", 4}, Host{"node2", 4}), WithNetwork("eth1"),
				WithLaunchAgent("/usr/bin/ssh"), WithEnviron([]string{"GOMLX_BACKEND=go"})},
			program: "./train",
			want: []string{"mpirun", "-np", "8", "-hosts", "node1:4,node2:4", "-launcher-exec", "/usr/bin/ssh",
				"-iface", "eth1", "./train"},
		},
		{
			name: "inside a Slurm allocation: its hosts and tasks", procs: 0,
			opts: []Option{WithEnviron([]string{"SLURM_JOB_ID=42", "SLURM_JOB_NODELIST=gpu[01-02],cpu7",
				"SLURM_TASKS_PER_NODE=4(x2),1"})},
			program: "./train",
			want: []string{"mpirun", "-np", "9", "--host", "gpu01:4,gpu02:4,cpu7:1", "--allow-run-as-root", "--bind-to",
				"none", "./train"},
		},
		{
			name: "inside a Slurm allocation, hosts given: they win", procs: 2,
			opts: []Option{WithEnviron([]string{"SLURM_JOB_ID=42", "SLURM_JOB_NODELIST=gpu[01-02]"}),
				WithHosts(Host{"a", 1}, Host{"b", 1})},
			program: "./train",
			want:    []string{"mpirun", "-np", "2", "--host", "a:1,b:1", "--allow-run-as-root", "--bind-to", "none", "./train"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withSingleCopy(t, !tt.noCMA)
			got, err := Argv(tt.procs, tt.program, tt.args, append(base[:len(base):len(base)], tt.opts...)...)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestArgvErrors(t *testing.T) {
	tests := []struct {
		name    string
		procs   int
		program string
		opts    []Option
		wantErr string
		wantIs  error
	}{
		{name: "negative processes", procs: -2, program: "./train", wantErr: "need at least 1 process, got -2"},
		{name: "no program", procs: 2, wantErr: "missing program"},
		{
			name: "no mpirun", procs: 2, program: "./train", opts: []Option{WithMPIRun("goaccel-no-such-mpirun")},
			wantErr: "apt-get install openmpi-bin libopenmpi-dev", wantIs: ErrMPIRunNotFound,
		},
		{
			name: "more processes than slots", procs: 5, program: "./train",
			opts:    []Option{WithHosts(Host{"h0", 2}, Host{"h1", 2})},
			wantErr: "5 processes do not fit the 4 slots of hosts h0:2,h1:2",
		},
		{
			name: "hosts and a hostfile", procs: 2, program: "./train",
			opts:    []Option{WithHosts(Host{"h0", 2}), WithHostfile("hosts")},
			wantErr: "both hosts (h0:2) and a hostfile (hosts)",
		},
		{
			name: "hosts and --host", procs: 2, program: "./train",
			opts:    []Option{WithHosts(Host{"h0", 2}), WithMPIRunArgs("--host", "h1:2")},
			wantErr: "both hosts (h0:2) and -host among the mpirun arguments",
		},
		{name: "not a subnet", procs: 1, program: "./train", opts: []Option{WithNetwork("10.0.0.0/33")},
			wantErr: `"10.0.0.0/33" is not a subnet`},
		{name: "host bits in the subnet", procs: 1, program: "./train", opts: []Option{WithNetwork("10.213.0.1/24")},
			wantErr: `"10.213.0.1/24" has host bits set: the subnet is 10.213.0.0/24`},
		{name: "not an interface", procs: 1, program: "./train", opts: []Option{WithNetwork("eth 0")},
			wantErr: `"eth 0" is neither a subnet`},
		{name: "MPICH takes an interface, not a subnet", procs: 1, program: "./train",
			opts: []Option{WithFlavor(MPICH), WithNetwork("10.0.0.0/8")}, wantErr: "MPICH's mpiexec takes one interface name"},
		{name: "unknown MPI cannot place on hosts", procs: 1, program: "./train",
			opts: []Option{WithFlavor(UnknownFlavor), WithHosts(Host{"a", 1})}, wantErr: "need Open MPI or MPICH"},
		{name: "forwarding a variable that is not set", procs: 1, program: "./train",
			opts: []Option{WithForwardEnv("GOACCEL_NO_SUCH_VARIABLE")}, wantErr: "cannot forward GOACCEL_NO_SUCH_VARIABLE: it is not set"},
		{name: "forwarding a bad name", procs: 1, program: "./train",
			opts: []Option{WithForwardEnv("A-B=1")}, wantErr: `cannot forward "A-B=1"`},
		{name: "Slurm without a node list", procs: 0, program: "./train",
			opts: []Option{WithEnviron([]string{"SLURM_JOB_ID=7"})}, wantErr: "SLURM_JOB_NODELIST is not"},
		{name: "Slurm tasks that do not match the nodes", procs: 0, program: "./train",
			opts:    []Option{WithEnviron([]string{"SLURM_JOB_ID=7", "SLURM_JOB_NODELIST=n[1-3]", "SLURM_TASKS_PER_NODE=2(x2)"})},
			wantErr: "SLURM_TASKS_PER_NODE=2(x2) gives 2 nodes' task counts, but SLURM_JOB_NODELIST=n[1-3] has 3 nodes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append([]Option{WithFlavor(OpenMPI), WithEnviron([]string{})}, tt.opts...)
			if tt.wantIs != nil {
				opts = tt.opts
			}
			_, err := Argv(tt.procs, tt.program, nil, opts...)
			require.ErrorContains(t, err, tt.wantErr)
			if tt.wantIs != nil {
				assert.True(t, errors.Is(err, tt.wantIs))
			}
		})
	}
}

func TestFlavorOf(t *testing.T) {
	tests := []struct {
		name    string
		version string
		want    Flavor
	}{
		{"open mpi 4", "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/", OpenMPI},
		{"open mpi 5", "prterun (Open MPI) 5.0.3", OpenMPI},
		{"mpich hydra", "HYDRA build details:\n    Version:                                 4.0.2", MPICH},
		{"intel mpi", "Intel(R) MPI Library for Linux* OS, Version 2021.10", MPICH},
		{"no output", "", UnknownFlavor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, flavorOf(tt.version))
		})
	}
}

func TestDefaultMCA(t *testing.T) {
	withSingleCopy(t, true)
	assert.Empty(t, DefaultMCA())
	withSingleCopy(t, false)
	assert.Equal(t, []MCAParam{{Name: "btl_vader_single_copy_mechanism", Value: "none",
		Why: "cross-process memory access (CMA) is unavailable: refused by the test"}}, DefaultMCA())
}

func TestString(t *testing.T) {
	assert.Equal(t, `mpirun -np 2 sh -c 'echo rank=$OMPI_COMM_WORLD_RANK' '' 'it'\''s'`,
		String([]string{"mpirun", "-np", "2", "sh", "-c", "echo rank=$OMPI_COMM_WORLD_RANK", "", "it's"}))
}

func TestExitCode(t *testing.T) {
	assert.Equal(t, 0, ExitCode(nil))
	assert.Equal(t, 1, ExitCode(errors.New("could not start")))
}

func TestParseHosts(t *testing.T) {
	tests := []struct {
		spec    string
		want    []Host
		wantErr string
	}{
		{spec: "node1:4,node2:4", want: []Host{{"node1", 4}, {"node2", 4}}},
		{spec: "a, b:2 ,10.0.0.7", want: []Host{{"a", 1}, {"b", 2}, {"10.0.0.7", 1}}},
		{spec: "gpu-01.cluster.local:8", want: []Host{{"gpu-01.cluster.local", 8}}},
		{spec: "", wantErr: "empty host list"},
		{spec: "a:0", wantErr: `host "a" in "a:0": slots must be a whole number of at least 1, got "0"`},
		{spec: "a:x", wantErr: `got "x"`},
		{spec: "a,,b", wantErr: `"" is not a host name`},
		{spec: "a,b,a:2", wantErr: `host "a" appears twice`},
		{spec: "-a", wantErr: `"-a" is not a host name: it starts with '-'`},
		{spec: "a:+4", wantErr: `slots must be a whole number of at least 1, got "+4"`},
		{spec: "a:1048577", wantErr: `host "a" in "a:1048577": slots must be at most 1048576, got "1048577"`},
		{spec: "a:99999999999999999999", wantErr: "slots must be at most 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := ParseHosts(tt.spec)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestExpandNodeList(t *testing.T) {
	tests := []struct {
		list    string
		want    []string
		wantLen int // instead of want, for long lists
		wantErr string
	}{
		{list: "node1", want: []string{"node1"}},
		{list: "node[1-3,5]", want: []string{"node1", "node2", "node3", "node5"}},
		{list: "gpu[01-03]", want: []string{"gpu01", "gpu02", "gpu03"}},
		{list: "n[8-10]", want: []string{"n8", "n9", "n10"}},
		{list: "n[098-101]", want: []string{"n098", "n099", "n100", "n101"}},
		{list: "a,b[1-2],c", want: []string{"a", "b1", "b2", "c"}},
		{list: "rack[1-2]-n[1-2]", want: []string{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}},
		{list: "gpu-a[01-02]b,cpu[7]", want: []string{"gpu-a01b", "gpu-a02b", "cpu7"}},
		{list: "node[1-3", wantErr: "unbalanced '['"},
		{list: "node1-3]", wantErr: "unbalanced ']'"},
		{list: "node[3-1]", wantErr: `"3-1" is not a number or a range`},
		{list: "node[a-b]", wantErr: `"a-b" is not a number or a range`},
		{list: "a,,b", wantErr: "empty name"},
		{list: "n[]", wantErr: `"" is not a number or a range`},
		{list: "n[+1]", wantErr: `"+1" is not a number or a range`},
		{list: "n[0-1023][0-1023]", wantLen: 1 << 20},
		// Counted, not expanded: 10^10 names would take hundreds of gigabytes.
		{list: "n[0-99999][0-99999]", wantErr: `"n[0-99999][0-99999]" names more than 1048576 hosts`},
		{list: "n[0-1023][0-1023],x", wantErr: `node list "n[0-1023][0-1023],x" names more than 1048576 hosts`},
		{list: "n[0-9223372036854775807]", wantErr: "names more than 1048576 hosts"},
		{list: "n[0-600000,0-600000]", wantErr: "names more than 1048576 hosts"},
		{list: "n[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]", wantErr: "names more than 1048576 hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.list, func(t *testing.T) {
			got, err := ExpandNodeList(tt.list)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if tt.wantLen > 0 {
				assert.Len(t, got, tt.wantLen)
				return
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestExpandTasksPerNode(t *testing.T) {
	tests := []struct {
		value   string
		want    []int
		wantLen int // instead of want, for long lists
		wantErr string
	}{
		{value: "4", want: []int{4}},
		{value: "4(x2)", want: []int{4, 4}},
		{value: "2(x3),1", want: []int{2, 2, 2, 1}},
		{value: "1,2,3", want: []int{1, 2, 3}},
		{value: "4(x0)", wantErr: "is not N or N(xM)"},
		{value: "4(2)", wantErr: "is not N or N(xM)"},
		{value: "", wantErr: "is not N or N(xM)"},
		{value: "+4", wantErr: "is not N or N(xM)"},
		{value: "4(x-1)", wantErr: "is not N or N(xM)"},
		{value: "1(x1048575),2", wantLen: 1 << 20},
		// Counted, not expanded: 10^12 counts would take eight terabytes.
		{value: "1(x1000000000000)", wantErr: `"1(x1000000000000)" gives more than 1048576 nodes' task counts`},
		{value: "1(x1048576),2", wantErr: "gives more than 1048576 nodes' task counts"},
		{value: "1(x99999999999999999999)", wantErr: "gives more than 1048576 nodes' task counts"},
		{value: "1048577", wantErr: `"1048577": a node runs at most 1048576 tasks`},
		{value: "99999999999999999999(x2)", wantErr: "a node runs at most 1048576 tasks"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := ExpandTasksPerNode(tt.value)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if tt.wantLen > 0 {
				assert.Len(t, got, tt.wantLen)
				return
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestSlurmHosts(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    []Host
	}{
		{name: "not in an allocation", environ: []string{"SLURM_JOB_NODELIST=n[1-2]"}},
		{name: "tasks per node", environ: []string{"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_TASKS_PER_NODE=3,1"},
			want: []Host{{"n1", 3}, {"n2", 1}}},
		{name: "ntasks per node", environ: []string{"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_NTASKS_PER_NODE=4"},
			want: []Host{{"n1", 4}, {"n2", 4}}},
		{name: "the older node list name, one task each", environ: []string{"SLURM_JOB_ID=1", "SLURM_NODELIST=a,b"},
			want: []Host{{"a", 1}, {"b", 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SlurmHosts(tt.environ)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
