package bench

import "time"

// Plan is what one run of the benchmarks measures. FullPlan is what `make bench` runs; QuickPlan is a
// smoke test with tiny sizes that proves the whole pipeline works in seconds.
type Plan struct {
	Quick bool  `json:"quick"`
	Ranks []int `json:"ranks"`

	// 1. All-reduce efficiency.
	AllReduceSizes  []int64 `json:"allreduce_sizes"`
	AllReduceTiming Timing  `json:"allreduce_timing"`
	// WhatIf repeats the multi-process measurements with changes weighed before they are made (Open MPI's
	// ring algorithm for MPI_Iallreduce, and a wait loop that never sleeps; see fixes.go). It is how the
	// changes of commit cfa8dcf were measured first; off by default now that they are in.
	WhatIf bool `json:"what_if"`

	// 2. Bucketing and 5. overlap.
	SyncModel  MLP     `json:"sync_model"`
	BucketCaps []int64 `json:"bucket_caps"`
	SyncTiming Timing  `json:"sync_timing"`

	// 3. Accumulation.
	Accumulation       TrainConfig `json:"accumulation"`
	AccumulationTiming Timing      `json:"accumulation_timing"`

	// 4. Overhead, one process.
	Overhead       []TrainConfig `json:"overhead"`
	OverheadTiming Timing        `json:"overhead_timing"`

	// JobTimeout bounds each mpirun job.
	JobTimeout time.Duration `json:"job_timeout"`
}

// DefaultBucketCapBytes is goaccel's default bucket cap, the one the bucketing goals are judged with.
const DefaultBucketCapBytes = 25 << 20

// deepMLP is the bucketing model: 51 Dense layers of mixed widths, so 102 gradient tensors (weights of
// 7.5 KB to 1 MB, biases of 40 bytes to 2.25 KB), 21.9 MB in all: many tensors of mixed sizes, the case
// bucketing is for.
func deepMLP() MLP {
	pattern := []int{448, 192, 320, 512, 256, 384, 128, 576}
	hidden := make([]int, 50)
	for i := range hidden {
		hidden[i] = pattern[i%len(pattern)]
	}
	return MLP{Inputs: 256, Hidden: hidden, Classes: 10}
}

// bagOfWords is the accumulation workload: a text classifier whose 8 MB embedding table dominates the
// gradients. Its gradient is a cheap scatter on the pure-Go backend, so communication is a visible share
// of a training step, the situation gradient accumulation is for.
func bagOfWords() TrainConfig {
	return TrainConfig{Name: "bow", Batch: 8, K: 4,
		Model: MLP{Vocab: 65536, Tokens: 16, Inputs: 32, Hidden: []int{64}, Classes: 10}}
}

// FullPlan is the measurement `make bench` runs: about ten minutes on a two-core machine.
func FullPlan() Plan {
	return Plan{
		Ranks:              []int{2, 4},
		AllReduceSizes:     []int64{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20},
		AllReduceTiming:    Timing{Samples: 21, SampleTime: 40 * time.Millisecond, MinIters: 1, MaxIters: 2000},
		SyncModel:          deepMLP(),
		BucketCaps:         []int64{1 << 20, 5 << 20, DefaultBucketCapBytes, 100 << 20},
		SyncTiming:         Timing{Samples: 21, SampleTime: 50 * time.Millisecond, MinIters: 1, MaxIters: 100},
		Accumulation:       bagOfWords(),
		AccumulationTiming: Timing{Samples: 25, SampleTime: 150 * time.Millisecond, MinIters: 1, MaxIters: 20},
		Overhead: []TrainConfig{
			// Fashion-MNIST's shape (DESIGN §9): compute-bound.
			{Name: "mlp", Model: MLP{Inputs: 784, Hidden: []int{128}, Classes: 10}, Batch: 32, K: 4},
			// The accumulation model: cheap compute, so any per-step cost goaccel adds shows.
			bagOfWords(),
		},
		OverheadTiming: Timing{Samples: 25, SampleTime: 400 * time.Millisecond, MinIters: 1, MaxIters: 20},
		JobTimeout:     10 * time.Minute,
	}
}

// QuickPlan measures everything once with tiny sizes: a smoke test of the pipeline, not a measurement.
func QuickPlan() Plan {
	tiny := Timing{Samples: 3, SampleTime: time.Millisecond, MinIters: 1, MaxIters: 3}
	small := MLP{Inputs: 16, Hidden: []int{32, 24, 16}, Classes: 4}
	return Plan{
		Quick:           true,
		Ranks:           []int{2},
		WhatIf:          true,
		AllReduceSizes:  []int64{64 << 10, 1 << 20},
		AllReduceTiming: tiny,
		SyncModel:       small,
		BucketCaps:      []int64{1 << 10, 4 << 10},
		SyncTiming:      tiny,
		Accumulation: TrainConfig{Name: "bow", Batch: 4, K: 2,
			Model: MLP{Vocab: 64, Tokens: 4, Inputs: 8, Hidden: []int{8}, Classes: 3}},
		AccumulationTiming: tiny,
		Overhead:           []TrainConfig{{Name: "mlp", Model: small, Batch: 4, K: 2}},
		OverheadTiming:     tiny,
		JobTimeout:         2 * time.Minute,
	}
}
