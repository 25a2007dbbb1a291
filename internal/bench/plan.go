package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/goaccel/goaccel/accumulate"
)

// plan is what one run measures: fullPlan is `make bench`, quickPlan a smoke test of the whole pipeline
// whose numbers mean nothing.
type plan struct {
	Quick bool
	// Ranks are the world sizes of the mpirun jobs that measure sections 1, 2, 3 and 5 (none: skipped).
	Ranks []int

	AllReduceSizes  []int64
	AllReduceTiming timing

	SyncModel  mlp
	BucketCaps []int64
	SyncTiming timing

	Accumulation       []trainConfig
	AccumulationTiming timing

	// Overhead runs in the driver's own process.
	Overhead       []trainConfig
	OverheadTiming timing

	Compute     computePlan
	EndToEnd    endToEndPlan
	Transformer transformerPlan
	ResNet      resNetPlan
	LSTM        lstmPlan
	PureGoCNN   pureGoPlan
	Demo        demoPlan
	Network     networkPlan
	Sharding    shardingPlan
	// Calibration sizes the short runs that choose each end-to-end PyTorch row's configuration.
	Calibration calibrationPlan

	// JobTimeout bounds each mpirun job and each child process.
	JobTimeout time.Duration
}

// defaultBucketCapBytes is goaccel's default bucket cap, the one the bucketing goals are judged with.
const defaultBucketCapBytes = accumulate.DefaultBucketCapBytes

// deepMLP is the bucketing model: 51 Dense layers of mixed widths, so 102 gradient tensors (weights of
// 7.5 KB to 1 MB, biases of 40 bytes to 2.25 KB), 21.9 MB in all: many tensors of mixed sizes, the case
// bucketing is for.
func deepMLP() mlp {
	pattern := []int{448, 192, 320, 512, 256, 384, 128, 576}
	hidden := make([]int, 50)
	for i := range hidden {
		hidden[i] = pattern[i%len(pattern)]
	}
	return mlp{Inputs: 256, Hidden: hidden, Classes: 10}
}

// bagOfWords is a text classifier whose 8 MB embedding table dominates the gradients while its gradient is
// a cheap scatter: the workload where communication weighs most in a training step.
func bagOfWords() trainConfig {
	return trainConfig{Name: "bow", Batch: 8, K: 4,
		Model: mlp{Vocab: 65536, Tokens: 16, Inputs: 32, Hidden: []int{64}, Classes: 10}}
}

// demoMLP is the grad_accum demo's shape: Fashion-MNIST's 784 pixels, 128 hidden units, batch 64, K = 4.
func demoMLP() trainConfig {
	return trainConfig{Name: "mlp", Model: mlp{Inputs: 784, Hidden: []int{128}, Classes: 10}, Batch: 64, K: 4}
}

// bigMLP is the compute workload: large enough that how gradients and matrix products are computed
// decides the step time and the memory.
func bigMLP() trainConfig {
	return trainConfig{Name: "big-mlp", Model: mlp{Inputs: 784, Hidden: []int{512, 512, 512}, Classes: 10}, Batch: 256, K: 1}
}

// pureGoVariants are the pure-Go CNN's programs: the baseline release first, the convolution executor last.
func pureGoVariants() []pureGoVariant {
	return []pureGoVariant{{Release: pureGoBaseline}, {Conv: "graph"}, {Conv: "kernel"}}
}

// charlmJob is examples/charlm's default job: the transformer section runs it as is.
func charlmJob() transformerPlan {
	return transformerPlan{Context: 64, DModel: 128, Heads: 4, Blocks: 2, Batch: 32, K: 1, Steps: 100, Warmup: 10,
		LR: 0.002, WeightDecay: 0.01, Clip: 1, Seed: 42, EvalWindows: 256}
}

// resNetJob is examples/resnet's default model and optimizer as `make bench` runs it: one epoch of every
// training example per run, five rounds (the accuracy goal is judged on the median over their seeds).
func resNetJob() resNetPlan {
	return resNetPlan{Rounds: 5, Procs: []int{1, 2}, Width: 16, Blocks: 1, Dropout: 0.2, Epochs: 1, Batch: 64, K: 1,
		LR: 0.002, Seed: 42}
}

// fullPlan is what `make bench` measures: about twenty minutes on a two-core machine once the demo's CNN
// trains fast (its five-epoch wall time is one of the measurements), thirteen more for the ResNet, and a
// few for the LSTM and the calibration of PyTorch's configuration (a minute or so per one-process row).
func fullPlan() plan {
	return plan{
		Ranks:          []int{2, 4},
		AllReduceSizes: []int64{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20},
		AllReduceTiming: timing{Samples: 21, SampleTime: 40 * time.Millisecond, MinIters: 1, MaxIters: 2000,
			Settle: 15 * time.Millisecond},
		SyncModel:          deepMLP(),
		BucketCaps:         []int64{1 << 20, 5 << 20, defaultBucketCapBytes, 100 << 20},
		SyncTiming:         timing{Samples: 21, SampleTime: 50 * time.Millisecond, MinIters: 1, MaxIters: 100},
		Accumulation:       []trainConfig{bagOfWords(), demoMLP()},
		AccumulationTiming: timing{Samples: 21, SampleTime: 150 * time.Millisecond, MinIters: 1, MaxIters: 20},
		Overhead:           []trainConfig{demoMLP(), bagOfWords()},
		OverheadTiming:     timing{Samples: 21, SampleTime: 300 * time.Millisecond, MinIters: 1, MaxIters: 20},
		Compute:            computePlan{Config: bigMLP(), Rounds: 2, StepTime: 3 * time.Second, MinSteps: 3, MaxSteps: 50},
		EndToEnd: endToEndPlan{Epochs: 1, Procs: []int{1, 2}, Batch: 64, K: 4, LR: 0.002, Seed: 42,
			// Five CNN rounds: its accuracy goal is judged on the median over the rounds' seeds.
			Models: []endToEndModel{{Name: "mlp", Rounds: 3}, {Name: "cnn", Rounds: 5}}},
		// Three rounds, so that one run slowed by the machine's other work does not decide a goal.
		Transformer: withRounds(charlmJob(), 3, []int{1, 2}),
		ResNet:      resNetJob(),
		LSTM:        lstmJob(),
		// One short epoch per variant: up to half a minute each without BLAS.
		PureGoCNN: pureGoPlan{Rounds: 1, Variants: pureGoVariants(), Epochs: 1, Batch: 64, K: 4, Limit: 8192,
			Seed: 42, LR: 0.002},
		Demo:     demoPlan{Runs: 1, Args: []string{"-model", "cnn"}},
		Network:  networkJob(),
		Sharding: shardingJob53M(),
		// Three interleaved runs of each candidate, each about a seventh of an epoch (a third of the
		// transformer's steps): a few seconds of training apiece.
		Calibration: calibrationPlan{Rounds: 3, Examples: 8192, Steps: 30},
		JobTimeout:  10 * time.Minute,
	}
}

// networkJob is section 6 as `make bench` runs it, about twenty minutes on a two-core machine: the 1024-wide
// MLP (3.26 MB per sync) with K=1, where the sync weighs most, on 2 and 4 hosts at four rates, in every mode
// against PyTorch DDP's counterparts, each run one pass over 16,384 examples (128 optimizer steps on 2 hosts,
// 64 on 4): at 100 Mbit/s a plain run's sync takes a quarter of a second.
func networkJob() networkPlan {
	models := []networkModel{{Name: "mlp", Hidden: 1024, Limit: 16384}}
	p := networkPlan{Rates: []int64{0, 10_000_000_000, 1_000_000_000, 100_000_000}, Hosts: 2, HostCounts: []int{2, 4},
		Models: models, Ks: []int{1}, Batch: 64, Epochs: 1, LR: 0.002, Seed: 42, Rounds: 1,
		Modes: []string{modePlain, modeBF16, modePowerSGD, modeLocalSGD, modeDiLoCo},
		// PowerSGD compresses after 10 exact syncs: PyTorch's default of 1000 is for runs of many thousand
		// steps; here it is a tenth of the shorter run's 64 steps, enough to let the first, fast-moving steps
		// be exact.
		PowerSGDRank: 4, PowerSGDStart: 10, LocalSteps: 8,
		// From one message's latency to where bandwidth decides: the α-β model's fit.
		AlphaBetaSizes: []int64{4 << 10, 256 << 10, 1 << 20, 4 << 20},
		// Half-second samples: only a sample's first sync can start on a full token bucket (see
		// docs/benchmarks-method.md), so it must be one of many.
		SyncTiming: timing{Samples: 9, SampleTime: 500 * time.Millisecond, MinIters: 1, MaxIters: 100},
		LinkCheck:  time.Second}
	p.Syncs = networkSyncs(models)
	return p
}

// networkSyncs are the gradients section 6 syncs alone: each end-to-end model's, and more.
func networkSyncs(models []networkModel, more ...mlp) []gradientLayout {
	var layouts []gradientLayout
	for _, m := range models {
		layouts = append(layouts, m.layout())
	}
	for _, m := range more {
		l := m.layout()
		l.Slug = fmt.Sprintf("mlp-%dlayers", len(m.Hidden)+1)
		layouts = append(layouts, l)
	}
	return layouts
}

// quickPlan measures everything once with tiny sizes.
func quickPlan() plan {
	tiny := timing{Samples: 3, SampleTime: time.Millisecond, MinIters: 1, MaxIters: 3}
	small := mlp{Inputs: 16, Hidden: []int{32, 24, 16}, Classes: 4}
	return plan{
		Quick:           true,
		Ranks:           []int{2},
		AllReduceSizes:  []int64{64 << 10, 1 << 20},
		AllReduceTiming: tiny,
		SyncModel:       small,
		BucketCaps:      []int64{1 << 10, 4 << 10},
		SyncTiming:      tiny,
		Accumulation: []trainConfig{{Name: "bow", Batch: 4, K: 2,
			Model: mlp{Vocab: 64, Tokens: 4, Inputs: 8, Hidden: []int{8}, Classes: 3}}},
		AccumulationTiming: tiny,
		Overhead:           []trainConfig{{Name: "mlp", Model: small, Batch: 4, K: 2}},
		OverheadTiming:     tiny,
		Compute: computePlan{Config: trainConfig{Name: "big-mlp", Model: small, Batch: 8, K: 1}, Rounds: 1,
			StepTime: time.Millisecond, MinSteps: 2, MaxSteps: 2},
		// The MLP only: the demo evaluates on the whole test set, which the CNN makes slow.
		EndToEnd: endToEndPlan{Epochs: 1, Procs: []int{1, 2}, Batch: 64, K: 4, LR: 0.002, Seed: 42, Limit: 512,
			Models: []endToEndModel{{Name: "mlp", Rounds: 1}}},
		Transformer: transformerPlan{Rounds: 1, Procs: []int{1, 2}, Context: 16, DModel: 16, Heads: 2, Blocks: 1,
			Batch: 4, K: 2, Steps: 3, Warmup: 1, LR: 0.002, WeightDecay: 0.01, Clip: 1, Seed: 42, Limit: 64,
			EvalWindows: 8},
		// The ResNet's plumbing: a narrow model on a few hundred examples (the runs still evaluate the whole
		// test set).
		ResNet: resNetPlan{Rounds: 1, Procs: []int{1, 2}, Width: 4, Blocks: 1, Dropout: 0.2, Epochs: 1, Batch: 32, K: 2,
			LR: 0.002, Seed: 42, Limit: 256},
		// The LSTM's plumbing: a few tiny epochs.
		LSTM: lstmPlan{Rounds: 1, Epochs: 2, Batch: 16, Examples: 128, Length: 8, Hidden: 8, LR: 0.01, Seed: 42},
		PureGoCNN: pureGoPlan{Rounds: 1, Variants: pureGoVariants(), Epochs: 1, Batch: 64, K: 4, Limit: 256,
			Seed: 42, LR: 0.002},
		Demo:    demoPlan{Runs: 1, Args: []string{"-model", "mlp", "-epochs", "1", "-limit", "512"}},
		Network: quickNetwork(),
		Sharding: shardingPlan{Config: trainConfig{Name: "mlp", Model: small, Batch: 4, K: 1}, Procs: []int{1, 2},
			Strategies: shardingStrategies(), Rounds: 1, Warmup: 1, Steps: 2},
		Calibration: calibrationPlan{Rounds: 1, Examples: 256},
		JobTimeout:  3 * time.Minute,
	}
}

// quickNetwork is section 6 on a real emulated cluster, unthrottled and throttled, with a tiny MLP.
func quickNetwork() networkPlan {
	models := []networkModel{{Name: "mlp", Hidden: 32, Limit: 512}}
	p := networkPlan{Rates: []int64{0, 1_000_000_000}, Hosts: 2, Models: models, Ks: []int{2}, Batch: 64, Epochs: 1,
		LR: 0.002, Seed: 42, Rounds: 1, SyncTiming: timing{Samples: 3, SampleTime: time.Millisecond, MinIters: 1, MaxIters: 3},
		LinkCheck: 200 * time.Millisecond}
	p.Syncs = networkSyncs(models)
	return p
}

// sections are what -only chooses from, each with what leaving it out clears from a plan.
var sections = map[string]func(*plan){
	"mpi":      func(p *plan) { p.Ranks = nil }, // sections 1, 2, 3 and 5: the mpirun jobs
	"overhead": func(p *plan) { p.Overhead = nil },
	"compute":  func(p *plan) { p.Compute.Rounds = 0 },
	"e2e":      func(p *plan) { p.EndToEnd.Models = nil },
	// The transformer language model against its PyTorch twin.
	"transformer": func(p *plan) { p.Transformer.Rounds = 0 },
	// examples/resnet against its PyTorch twin, with and without BLAS.
	"resnet": func(p *plan) { p.ResNet.Rounds = 0 },
	// examples/lstm against its PyTorch twin: reported, no goal.
	"lstm": func(p *plan) { p.LSTM.Rounds = 0 },
	// The CNN without BLAS, each convolution lowering.
	"purego": func(p *plan) { p.PureGoCNN.Rounds = 0 },
	// The demo's wall time.
	"demo": func(p *plan) { p.Demo.Runs = 0 },
	// Section 6: end to end and syncs across hosts, at several link rates.
	"network": func(p *plan) { p.Network.Rates = nil },
	// ZeRO: optimizer state, peak memory and step time under each sharding strategy.
	"sharding": func(p *plan) { p.Sharding.Rounds = 0 },
}

// shardingStrategies are the strategies the sharding section compares, the reference first.
func shardingStrategies() []string { return []string{"replicated", "optimizer", "gradients"} }

// shardingJob53M is the sharding section as `make bench` runs it: an MLP of 53.6 million float32
// parameters (214 MB; Adam's moments twice that), big enough that the training state, not the Go runtime
// or the compiled graphs, decides a process's memory; a small batch, so that activations do not. Each of
// the 7 configurations runs twice, about ten minutes on a two-core machine.
func shardingJob53M() shardingPlan {
	return shardingPlan{Config: trainConfig{Name: "mlp-53M", Batch: 8, K: 1,
		Model: mlp{Inputs: 784, Hidden: []int{4096, 4096, 4096, 4096}, Classes: 10}},
		Procs: []int{1, 2, 4}, Strategies: shardingStrategies(), Rounds: 2, Warmup: 3, Steps: 10}
}

// withRounds is a transformer job run rounds times on each process count.
func withRounds(job transformerPlan, rounds int, procs []int) transformerPlan {
	job.Rounds, job.Procs = rounds, procs
	return job
}

// allSections is every section's name, comma-separated.
func allSections() string { return strings.Join(slices.Sorted(maps.Keys(sections)), ",") }

// only keeps the sections named in the comma-separated list.
func (p *plan) only(list string) error {
	keep := strings.Split(list, ",")
	for _, name := range keep {
		if sections[name] == nil {
			return fmt.Errorf("unknown section %q (want some of %s)", name, allSections())
		}
	}
	for name, clear := range sections {
		if !slices.Contains(keep, name) {
			clear(p)
		}
	}
	return nil
}
