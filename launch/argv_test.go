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
		{name: "zero processes", procs: 0, program: "./train", wantErr: "need at least 1 process, got 0"},
		{name: "negative processes", procs: -2, program: "./train", wantErr: "need at least 1 process, got -2"},
		{name: "no program", procs: 2, wantErr: "missing program"},
		{
			name: "no mpirun", procs: 2, program: "./train", opts: []Option{WithMPIRun("goaccel-no-such-mpirun")},
			wantErr: "apt-get install openmpi-bin libopenmpi-dev", wantIs: ErrMPIRunNotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Argv(tt.procs, tt.program, nil, tt.opts...)
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
