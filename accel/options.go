package accel

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/prepare"
)

// Option configures an Accelerator.
type Option func(*config)

type config struct {
	accumulationSteps int
	syncEachBatch     bool
	splitBatches      bool
	bucketCapMB       float64
	memoryLimit       int64
	seed              uint64
	backend           string
	allowDownloads    bool
	engine            string
	comm              *backends.Communicator
	checkReplicas     bool
	debug             bool
	timeout           time.Duration
	checkpointLimit   int
	checkpointDir     string
	compression       accumulate.Compression
	sharding          accumulate.Sharding
	powerSGD          *accumulate.PowerSGDConfig
	bufferSync        prepare.BufferSync
	// localSGD is set by WithLocalSGD and WithDiLoCo (nil: gradients are all-reduced every step).
	localSGD *prepare.LocalSGD
	out      io.Writer
	trackers []Tracker

	// backendSource names the environment variable backend came from ("" for a program's option).
	backendSource string
	// computeThreads, gradients, matmul and visibleDevices configure the compute backend (cpu.Config).
	computeThreads int
	gradients      string
	matmul         string
	convolutions   string
	visibleDevices string
	// restartCount is how many times a launcher restarted the job (see RestartCount).
	restartCount int
	// timeline is the file the job's timeline is written to ("": none; see WithTimeline).
	timeline string
	// overlap starts gradient syncs inside the training step (WithOverlap).
	overlap bool
}

// CheckReplicasEnvVar turns on the replica check (see WithReplicaCheck) when set to 1, true, yes or on (read with
// the other variables by OptionsFromEnv).
const CheckReplicasEnvVar = "GOACCEL_CHECK_REPLICAS"

// GradientCompressionEnvVar sets the format gradients travel in (see WithGradientCompression): bf16, fp16 or
// none (read with the other variables by OptionsFromEnv).
const GradientCompressionEnvVar = "GOACCEL_GRADIENT_COMPRESSION"

// PowerSGDEnvVar turns on the PowerSGD comm hook (see WithPowerSGD): RANK or RANK:START, such as 4:100
// (read with the other variables by OptionsFromEnv).
const PowerSGDEnvVar = "GOACCEL_POWERSGD"

// OverlapEnvVar turns the overlap of the gradient sync with the backward pass on or off (see WithOverlap):
// 1, true, yes or on; 0, false, no or off (read with the other variables by OptionsFromEnv).
const OverlapEnvVar = "GOACCEL_OVERLAP"

// ShardingEnvVar sets the sharding strategy (see WithSharding): replicated, optimizer or gradients (read
// with the other variables by OptionsFromEnv).
const ShardingEnvVar = "GOACCEL_SHARDING"

// LocalSGDEnvVar sets local SGD's period H (see WithLocalSGD); 0 turns it off (read with the other
// variables by OptionsFromEnv).
const LocalSGDEnvVar = "GOACCEL_LOCAL_SGD"

// DiLoCoEnvVar sets DiLoCo's period H, and optionally the outer optimizer's learning rate and momentum:
// H, H:LR or H:LR:MOMENTUM (see WithDiLoCo); 0 turns it off (read with the other variables by OptionsFromEnv).
const DiLoCoEnvVar = "GOACCEL_DILOCO"

func defaultConfig() config {
	return config{
		accumulationSteps: 1,
		bucketCapMB:       float64(accumulate.DefaultBucketCapBytes) / (1 << 20),
		seed:              42,
		out:               os.Stdout,
	}
}

func (c config) validate() error {
	if c.accumulationSteps < 1 {
		return fmt.Errorf("accel: gradient accumulation steps must be at least 1, got %d", c.accumulationSteps)
	}
	if !(c.bucketCapMB > 0) || math.IsInf(c.bucketCapMB, 0) {
		return fmt.Errorf("accel: bucket cap must be a positive number of MB, got %g", c.bucketCapMB)
	}
	if c.memoryLimit < 0 {
		return fmt.Errorf("accel: memory limit must be a number of bytes (0: none), got %d", c.memoryLimit)
	}
	if c.timeout < 0 {
		return fmt.Errorf("accel: collective timeout must not be negative, got %s", c.timeout)
	}
	if c.checkpointLimit < 0 {
		return fmt.Errorf("accel: checkpoint limit must be a number of checkpoints to keep (0 keeps all), got %d",
			c.checkpointLimit)
	}
	if c.computeThreads < 0 {
		return fmt.Errorf("accel: compute threads must not be negative, got %d", c.computeThreads)
	}
	if !c.bufferSync.Valid() {
		return fmt.Errorf("accel: buffer sync must be accel.BroadcastBuffers, AverageBuffers or NoBufferSync, got %s",
			c.bufferSync)
	}
	if c.sharding != nil {
		if _, err := accumulate.ParseSharding(c.sharding.Name()); err != nil {
			return fmt.Errorf("accel: sharding must be accel.Replicated, ShardOptimizer or ShardGradients: %w", err)
		}
	}
	if c.powerSGD != nil {
		switch {
		case c.compression != accumulate.NoCompression:
			return fmt.Errorf("accel: PowerSGD and %s compression are two comm hooks; choose one", c.compression)
		case c.sharding != nil && c.sharding.Stage() > 0:
			return fmt.Errorf("accel: PowerSGD all-reduces each bucket's factors whole; it cannot run under the %s "+
				"sharding strategy", c.sharding.Name())
		case c.syncEachBatch:
			return errors.New("accel: PowerSGD compresses the syncs an optimizer step follows; it does not run with " +
				"sync-each-batch")
		}
		if _, err := accumulate.NewPowerSGDHook(*c.powerSGD); err != nil {
			return fmt.Errorf("accel: %w", err)
		}
	}
	if !c.compression.Valid() {
		return fmt.Errorf("accel: gradient compression must be accumulate.NoCompression, BF16 or FP16, got %s",
			c.compression)
	}
	if l := c.localSGD; l != nil {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("accel: %w", err)
		}
		switch {
		case c.shardingOrDefault().Stage() > 0:
			return fmt.Errorf("accel: %s averages whole parameters and keeps each process's optimizer state whole; "+
				"the %s sharding strategy splits both between processes: use accel.Replicated", l, c.sharding.Name())
		case c.compression != accumulate.NoCompression:
			return fmt.Errorf("accel: %s sends no gradients, so gradient compression (%s) has nothing to compress, "+
				"and the parameter averages travel in the parameters' own dtype: leave compression off", l, c.compression)
		case c.syncEachBatch:
			return fmt.Errorf("accel: %s all-reduces no gradients, and sync-each-batch all-reduces every "+
				"micro-batch's: use one or the other", l)
		case c.powerSGD != nil:
			return fmt.Errorf("accel: %s sends no gradients, so PowerSGD has nothing to compress: use one or the "+
				"other", l)
		}
	}
	return nil
}

// WithGradientAccumulationSteps sets K: Accumulate syncs gradients (and the optimizer steps) once every K
// micro-batches. Default 1.
func WithGradientAccumulationSteps(k int) Option {
	return func(c *config) { c.accumulationSteps = k }
}

// WithSyncEachBatch makes Accumulate all-reduce every micro-batch's gradients once its training step has
// returned, while the optimizer still steps every K-th micro-batch (Accelerate's sync_each_batch). The
// weights are those of plain accumulation, up to float rounding; it costs K all-reduces per step instead
// of one. The all-reduce does not overlap the backward pass: it starts after the whole compiled step, as
// every sync does (see the reducer, docs/semantics.md section 10).
func WithSyncEachBatch() Option { return func(c *config) { c.syncEachBatch = true } }

// WithSplitBatches makes the batch size given to PrepareDataLoader global: each of N processes takes 1/N of
// it (Accelerate's split_batches; see prepare.SplitBatches). By default the batch size is per process.
func WithSplitBatches() Option { return func(c *config) { c.splitBatches = true } }

// WithMemoryLimit caps the memory, in bytes, each process counts on when a model is built (0: no cap): a
// model whose parameters, optimizer state and one micro-batch's activations are estimated to need more is
// refused with prepare.ErrOutOfMemory, as it is when the machine or a cgroup has less. It leaves room for
// what else the process or the machine runs; FindExecutableBatchSize then finds the batch that fits in it.
func WithMemoryLimit(bytes int64) Option { return func(c *config) { c.memoryLimit = bytes } }

// WithBucketCapMB caps the size of gradient buckets (default 25 MB, like torch DDP). With smaller buckets
// more of a sync's device-to-host copies overlap the reduction of the buckets before them; larger ones pay
// per-call overheads less often.
func WithBucketCapMB(mb float64) Option { return func(c *config) { c.bucketCapMB = mb } }

// WithGradientCompression sends gradient buckets between processes as 16-bit floats, accumulate.BF16 or
// accumulate.FP16, like PyTorch DDP's bf16_compress_hook and fp16_compress_hook: the wire carries half
// the bytes, the sum is computed in float32 on arrival (each addition rounded back to 16 bits once), and
// the accumulators, the averaging and the optimizer stay float32. The synced gradient then differs from the
// exact one by rounding (docs/semantics.md section 10); with one process nothing travels and nothing
// changes. accumulate.NoCompression is the default. GOACCEL_GRADIENT_COMPRESSION=bf16|fp16|none sets it too;
// every rank must use the same format (the ranks compare it on the first Backward).
func WithGradientCompression(format accumulate.Compression) Option {
	return func(c *config) { c.compression = format }
}

// WithPowerSGD sends gradient matrices between processes as PowerSGD's rank-r factors (PyTorch's
// powerSGD_hook; see accumulate.PowerSGDHook): with error feedback and warm start by default, vectors and
// small matrices uncompressed, and the first cfg.StartIter syncs in full (PyTorch's default 1000; 0
// compresses from the first). The synced gradient is then an approximation of the mean, a much smaller
// one on the wire: what slow links need (docs/powersgd.md). Its state (each process's error feedback, the
// shared Qs) is saved in checkpoints and resumes exactly; on another number of processes the errors start
// at zero. It does nothing on one process, and is refused with gradient compression, a sharding strategy
// or sync-each-batch. GOACCEL_POWERSGD=RANK[:START] sets it too.
func WithPowerSGD(cfg accumulate.PowerSGDConfig) Option {
	return func(c *config) { c.powerSGD = &cfg }
}

// WithOverlap starts each gradient bucket's all-reduce inside the training step, as soon as the backward
// pass has produced the bucket, as PyTorch DDP does, instead of after the step: the communication of the
// last layers' buckets overlaps the backward pass of the first layers. It applies to a micro-batch that
// syncs, under the Replicated strategy, with more than one process, on the pure-Go backend with goaccel's
// kernels; elsewhere (XLA, ShardOptimizer and ShardGradients, sync-each-batch's intermediate all-reduces)
// the sync follows the step as without it. The synced gradients, hence the weights, are the same bit for
// bit, the counters too (one sync per optimizer step, each bucket reduced once). What it saves is bounded
// by the backward pass that follows a bucket's readiness: docs/overlap.md has the measurements behind the
// default, off. GOACCEL_OVERLAP=1|0 sets it too.
func WithOverlap(on bool) Option { return func(c *config) { c.overlap = on } }

// Sharding strategies (WithSharding).
var (
	// Replicated keeps the whole training state on every process: the default, plain data parallelism.
	Replicated accumulate.Sharding = accumulate.Replicated{}
	// ShardOptimizer is ZeRO stage 1: each process keeps the optimizer's state for 1/N of the parameters.
	ShardOptimizer accumulate.Sharding = accumulate.ShardOptimizer{}
	// ShardGradients is ZeRO stage 2: ShardOptimizer, and the synced gradients are kept for 1/N too.
	ShardGradients accumulate.Sharding = accumulate.ShardGradients{}
)

// WithSharding chooses how the training state is split between processes, as DeepSpeed's ZeRO stages 1
// and 2: Replicated (the default) keeps everything on every process; ShardOptimizer reduce-scatters the
// gradients so that each process receives the mean of its 1/N block of every bucket, updates that block
// alone with the optimizer's state for it alone, and all-gathers the updated parameters (the same bytes
// on the wire as the all-reduce it replaces); ShardGradients also keeps no whole-model gradient
// accumulator between steps when every micro-batch syncs. Float32 Adam then holds 8Ψ + 8Ψ/N or
// 4Ψ + 12Ψ/N bytes per process for Ψ parameters, plus one block of the parameters (4Ψ/N), instead of
// 16Ψ. The weights are the replicated run's up to the order in which the engine sums the ranks' gradients
// (docs/sharding.md). Checkpoints record the strategy, write each process's blocks in parallel, and load
// on any number of processes with any strategy. On one process there is nothing to split: it runs
// replicated. GOACCEL_SHARDING=replicated|optimizer|gradients sets it too; every rank must use the same.
func WithSharding(s accumulate.Sharding) Option { return func(c *config) { c.sharding = s } }

// BufferSync says how prepared models keep their buffers — the variables the training step changes but
// does not train, such as batch normalisation's moving mean and variance — identical across processes.
type BufferSync = prepare.BufferSync

const (
	// BroadcastBuffers gives every process rank 0's buffers at each gradient sync an optimizer step follows
	// (PyTorch DDP's broadcast_buffers). The default.
	BroadcastBuffers = prepare.BroadcastBuffers
	// AverageBuffers gives every process the mean of the processes' floating-point buffers at the same points.
	AverageBuffers = prepare.AverageBuffers
	// NoBufferSync leaves each process its own buffers; the replica checks leave them out.
	NoBufferSync = prepare.NoBufferSync
)

// WithBufferSync chooses how the models this accelerator prepares keep their buffers identical across
// processes: accel.BroadcastBuffers (the default: rank 0's, as PyTorch DDP), accel.AverageBuffers (the
// processes' mean, statistics of every process's examples) or accel.NoBufferSync (each its own). Buffers are
// synchronised after the forward pass of each micro-batch that an optimizer step follows, never inside
// NoSync or on the other micro-batches of an accumulation cycle (docs/semantics.md section 12). Every
// process must use the same mode (the processes compare it on the first Backward).
func WithBufferSync(mode BufferSync) Option { return func(c *config) { c.bufferSync = mode } }

// WithLocalSGD trains each process on its own gradients for h optimizer steps and then averages the
// parameters across processes (Accelerate's LocalSGD(local_sgd_steps=h)): no gradient all-reduce at all,
// and one all-reduce of the parameters per bucket every h steps, so a job on ordinary Ethernet sends h
// times fewer bytes per step. The optimizer's state stays each process's own; buffers (batch
// normalisation) are averaged with the parameters. h counts optimizer steps: with K-step accumulation an
// average follows every h·K micro-batches. h = 1 with plain SGD is synchronous training up to float
// rounding. It cannot be combined with a sharding strategy, gradient compression or sync-each-batch (New
// refuses them). GOACCEL_LOCAL_SGD=h sets it too. See docs/localsgd.md.
func WithLocalSGD(h int) Option {
	return func(c *config) { c.localSGD = &prepare.LocalSGD{Steps: h} }
}

// DiLoCo's outer optimizer in the DiLoCo paper (Douillard et al., 2023): learning rate 0.7, Nesterov
// momentum 0.9 (WithDiLoCo, GOACCEL_DILOCO).
const (
	DefaultOuterLearningRate = prepare.DefaultOuterLearningRate
	DefaultOuterMomentum     = prepare.DefaultOuterMomentum
)

// WithDiLoCo is WithLocalSGD with DiLoCo's outer optimizer: every h inner steps (each process's own
// optimizer, such as AdamW, on its own data) the processes average their parameters, take the
// pseudo-gradient Δ = θ_outer − mean(θ_local) against the parameters of the last average, θ_outer, and
// step θ_outer with SGD with Nesterov momentum (outerLR, outerMomentum; the paper's 0.7 and 0.9 are
// DefaultOuterLearningRate and DefaultOuterMomentum); every process continues from the new
// θ_outer. θ_outer and the outer momentum are identical on every process and kept in checkpoints.
// GOACCEL_DILOCO=h sets it with the default outer optimizer.
func WithDiLoCo(h int, outerLR, outerMomentum float64) Option {
	return func(c *config) {
		c.localSGD = &prepare.LocalSGD{Steps: h, Outer: &prepare.OuterSGD{LearningRate: outerLR, Momentum: outerMomentum}}
	}
}

// WithSeed sets the seed data loaders shuffle with (default 42). Every rank must use the same seed.
func WithSeed(seed uint64) Option { return func(c *config) { c.seed = seed } }

// WithBackend names the GoMLX compute backend configuration ("go", "xla:cpu", "xla:cuda"). By default
// GOMLX_BACKEND decides (read by OptionsFromEnv), else XLA if a PJRT plugin is installed, else the pure-Go
// backend.
func WithBackend(backendConfig string) Option {
	return func(c *config) { c.backend, c.backendSource = backendConfig, "" }
}

// WithGradientKernels chooses the gradients of matrix multiplications and convolutions: "gemm" (the
// default) builds them as matrix multiplications the pure-Go backend runs fast, "gomlx" keeps GoMLX's own.
// GOACCEL_GRADIENTS sets it too (cpu.GradientsEnvVar).
func WithGradientKernels(kind string) Option { return func(c *config) { c.gradients = kind } }

// WithMatmul chooses the pure-Go backend's matrix multiplication: "blas" (the default in a build with the
// blas tag) runs it on OpenBLAS, "go" keeps the backend's own kernel. GOACCEL_MATMUL sets it too
// (cpu.MatmulEnvVar).
func WithMatmul(kind string) Option { return func(c *config) { c.matmul = kind } }

// WithConvolutions chooses how the pure-Go backend convolves and pools: "kernel" (the default) runs
// convolutions as im2col + gemm and pooling as window walks, with gradients built as convolutions;
// "graph" lowers both into slices and dots in the graph, as earlier versions did (for comparisons).
// GOACCEL_CONV sets it too (cpu.ConvEnvVar).
func WithConvolutions(kind string) Option { return func(c *config) { c.convolutions = kind } }

// WithComputeThreads sets the compute threads of this process (its BLAS threads; with 1 the pure-Go
// backend runs a graph's operations one after another). By default the node's cores divided by the
// processes on it. GOACCEL_BLAS_THREADS sets it too (cpu.ThreadsEnvVar).
func WithComputeThreads(n int) Option { return func(c *config) { c.computeThreads = n } }

// WithPluginDownloads lets GoMLX download PJRT plugins at run time (off by default).
func WithPluginDownloads() Option { return func(c *config) { c.allowDownloads = true } }

// WithEngine names the collective engine ("single", "mpi"). By default: "single" for one process, "mpi"
// when launched with several.
func WithEngine(name string) Option { return func(c *config) { c.engine = name } }

// WithCommunicator uses an existing communicator (for example one rank of backends.NewInProcessGroup)
// instead of detecting the topology. The Accelerator does not close it.
func WithCommunicator(comm *backends.Communicator) Option { return func(c *config) { c.comm = comm } }

// WithReplicaCheck verifies after every optimizer step that all ranks hold bitwise-identical weights, and
// fails the step naming the first divergent variable. It costs an all-gather per step; for debugging.
// GOACCEL_CHECK_REPLICAS=1 turns it on too.
func WithReplicaCheck() Option { return func(c *config) { c.checkReplicas = true } }

// WithDebug turns on the debug mode (like Accelerate's): before every collective — gradient syncs, the
// checkpoint and replica collectives, not only the user-facing Gather, Reduce and Broadcast, which are
// always checked — the ranks verify that all of them are calling the same operation with the same element
// type, length and root, and fail on every rank with a *backends.MismatchError naming the calls and the
// ranks otherwise. It costs a small all-gather per collective and serialises the gradient buckets'
// transfers. GOACCEL_DEBUG=1 turns it on too (backends.CallChecksEnvVar); every rank must use the same mode.
func WithDebug() Option { return func(c *config) { c.debug = true } }

// WithCollectiveTimeout bounds every collective wait (default backends.DefaultTimeout): a rank that dies
// or hangs makes the others fail with an error naming the operation and step instead of waiting forever.
func WithCollectiveTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithOutput sets where Print writes (default os.Stdout).
func WithOutput(w io.Writer) Option { return func(c *config) { c.out = w } }

// shardingOrDefault is the strategy asked for, Replicated when none was.
func (c config) shardingOrDefault() accumulate.Sharding {
	if c.sharding == nil {
		return accumulate.Replicated{}
	}
	return c.sharding
}
