package backends

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
)

// Topology says where this process sits in the job: its global rank, the world size, its rank and the
// number of ranks on its node, and the number of nodes. It is read from the launcher's environment.
type Topology struct {
	Rank      int
	WorldSize int
	LocalRank int
	LocalSize int
	Nodes     int
	// Source names the launcher whose variables were read ("openmpi", "mpich", "slurm", "torchrun") or
	// "default" when none were set.
	Source string
}

// Oversubscribed reports whether this node runs more ranks than it has cores: waiting ranks must then hand
// the processor to each other instead of spinning.
func (t Topology) Oversubscribed() bool { return t.LocalSize > runtime.NumCPU() }

// launcherVars lists, per launcher, the environment variables for rank, world size, local rank, local size
// and node count ("" when that launcher does not export one). Order matters: a job started by mpirun under
// SLURM carries both sets, and the MPI launcher's own variables are the ones MPI_Init agrees with.
var launcherVars = []struct {
	source                                     string
	rank, size, localRank, localSize, numNodes string
}{
	{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", ""},
	{"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", ""},
	{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES"},
	{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", ""},
}

// DetectTopology reads the topology from the environment of the first launcher whose rank and size
// variables are both set. Without any, it is a single process: rank 0 of 1.
func DetectTopology() (Topology, error) {
	return detectTopology(os.Getenv)
}

func detectTopology(getenv func(string) string) (Topology, error) {
	for _, lv := range launcherVars {
		rankStr, sizeStr := getenv(lv.rank), getenv(lv.size)
		if rankStr == "" || sizeStr == "" {
			continue
		}
		t := Topology{Source: lv.source}
		var err error
		if t.Rank, err = envInt(lv.rank, rankStr); err != nil {
			return Topology{}, err
		}
		if t.WorldSize, err = envInt(lv.size, sizeStr); err != nil {
			return Topology{}, err
		}
		t.LocalRank, t.LocalSize, t.Nodes = t.Rank, t.WorldSize, 1
		if s := getenv(lv.localRank); s != "" {
			if t.LocalRank, err = envInt(lv.localRank, s); err != nil {
				return Topology{}, err
			}
		}
		if s := getenv(lv.localSize); s != "" {
			// SLURM_NTASKS_PER_NODE may read "4(x2)"; take the leading number.
			if t.LocalSize, err = envInt(lv.localSize, leadingDigits(s)); err != nil {
				return Topology{}, err
			}
		}
		if lv.numNodes != "" && getenv(lv.numNodes) != "" {
			if t.Nodes, err = envInt(lv.numNodes, getenv(lv.numNodes)); err != nil {
				return Topology{}, err
			}
		} else if t.LocalSize > 0 {
			t.Nodes = (t.WorldSize + t.LocalSize - 1) / t.LocalSize
		}
		return t, t.Validate()
	}
	return Topology{Rank: 0, WorldSize: 1, LocalRank: 0, LocalSize: 1, Nodes: 1, Source: "default"}, nil
}

// Validate checks that the numbers are consistent.
func (t Topology) Validate() error {
	switch {
	case t.WorldSize < 1:
		return fmt.Errorf("backends: world size %d from %s must be at least 1", t.WorldSize, t.Source)
	case t.Rank < 0 || t.Rank >= t.WorldSize:
		return fmt.Errorf("backends: rank %d from %s outside [0, %d)", t.Rank, t.Source, t.WorldSize)
	case t.LocalSize < 1 || t.LocalRank < 0 || t.LocalRank >= t.LocalSize:
		return fmt.Errorf("backends: local rank %d of %d from %s is inconsistent", t.LocalRank, t.LocalSize, t.Source)
	case t.Nodes < 1:
		return fmt.Errorf("backends: node count %d from %s must be at least 1", t.Nodes, t.Source)
	}
	return nil
}

// IsMain reports whether this is the job's rank 0.
func (t Topology) IsMain() bool { return t.Rank == 0 }

// IsLocalMain reports whether this is the first rank on its node.
func (t Topology) IsLocalMain() bool { return t.LocalRank == 0 }

func (t Topology) String() string {
	return fmt.Sprintf("rank %d/%d (local %d/%d, %d node(s), from %s)", t.Rank, t.WorldSize, t.LocalRank,
		t.LocalSize, t.Nodes, t.Source)
}

func envInt(name, value string) (int, error) {
	n, err := strconv.Atoi(value)
	if err != nil {
		return 0, fmt.Errorf("backends: environment variable %s=%q is not an integer", name, value)
	}
	return n, nil
}

func leadingDigits(s string) string {
	for i, r := range s {
		if r < '0' || r > '9' {
			return s[:i]
		}
	}
	return s
}
