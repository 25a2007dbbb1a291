package backends

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDetectTopology(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Topology
		wantErr string
	}{
		{
			name: "no launcher",
			env:  map[string]string{"PATH": "/bin"},
			want: Topology{Rank: 0, WorldSize: 1, LocalRank: 0, LocalSize: 1, Nodes: 1, Source: "default"},
		},
		{
			name: "openmpi mpirun -np 8 over two nodes",
			env: map[string]string{"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
				"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
			want: Topology{Rank: 5, WorldSize: 8, LocalRank: 1, LocalSize: 4, Nodes: 2, Source: "openmpi"},
		},
		{
			name: "openmpi without local variables: one node",
			env:  map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"},
			want: Topology{Rank: 2, WorldSize: 3, LocalRank: 2, LocalSize: 3, Nodes: 1, Source: "openmpi"},
		},
		{
			name: "mpich hydra",
			env: map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
				"MPI_LOCALNRANKS": "2"},
			want: Topology{Rank: 3, WorldSize: 4, LocalRank: 1, LocalSize: 2, Nodes: 2, Source: "mpich"},
		},
		{
			name: "slurm srun -N2 --ntasks-per-node=4",
			env: map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2",
				"SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2"},
			want: Topology{Rank: 6, WorldSize: 8, LocalRank: 2, LocalSize: 4, Nodes: 2, Source: "slurm"},
		},
		{
			name: "slurm tasks per node in compressed form",
			env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0",
				"SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_NNODES": "2"},
			want: Topology{Rank: 0, WorldSize: 8, LocalRank: 0, LocalSize: 4, Nodes: 2, Source: "slurm"},
		},
		{
			name: "torchrun",
			env: map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
				"LOCAL_WORLD_SIZE": "2"},
			want: Topology{Rank: 1, WorldSize: 2, LocalRank: 1, LocalSize: 2, Nodes: 1, Source: "torchrun"},
		},
		{
			name: "mpirun inside a slurm allocation: the MPI launcher's variables win",
			env: map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
				"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
				"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1"},
			want: Topology{Rank: 1, WorldSize: 2, LocalRank: 1, LocalSize: 2, Nodes: 1, Source: "openmpi"},
		},
		{
			name: "rank without size is ignored",
			env:  map[string]string{"OMPI_COMM_WORLD_RANK": "1", "RANK": "0", "WORLD_SIZE": "1"},
			want: Topology{Rank: 0, WorldSize: 1, LocalRank: 0, LocalSize: 1, Nodes: 1, Source: "torchrun"},
		},
		{
			name:    "not a number",
			env:     map[string]string{"PMI_RANK": "one", "PMI_SIZE": "2"},
			wantErr: `PMI_RANK="one" is not an integer`,
		},
		{
			name:    "rank outside the world",
			env:     map[string]string{"SLURM_PROCID": "4", "SLURM_NTASKS": "4"},
			wantErr: "rank 4 from slurm outside [0, 4)",
		},
		{
			name:    "empty world",
			env:     map[string]string{"RANK": "0", "WORLD_SIZE": "0"},
			wantErr: "world size 0 from torchrun must be at least 1",
		},
		{
			name: "local rank beyond local size",
			env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
				"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
			wantErr: "local rank 2 of 2 from openmpi is inconsistent",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := detectTopology(func(name string) string { return tt.env[name] })
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestTopologyHelpers(t *testing.T) {
	topo := Topology{Rank: 4, WorldSize: 8, LocalRank: 0, LocalSize: 4, Nodes: 2, Source: "slurm"}
	assert.False(t, topo.IsMain())
	assert.True(t, topo.IsLocalMain())
	assert.Equal(t, "rank 4/8 (local 0/4, 2 node(s), from slurm)", topo.String())
	assert.True(t, Topology{WorldSize: 1, LocalSize: 1, Nodes: 1}.IsMain())
}

func TestOversubscribed(t *testing.T) {
	cores := runtime.NumCPU()
	for localSize, want := range map[int]bool{1: false, cores: false, cores + 1: true} {
		assert.Equal(t, want, Topology{LocalSize: localSize}.Oversubscribed(), "%d ranks on %d cores", localSize, cores)
	}
}
