package accel_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// compressedTolerance is how far, relative to each variable's largest weight, S optimizer steps of SGD on
// N ranks with gradients sent in format may leave the weights from one process's exact training.
//
// Derivation. A synced gradient element is the sum over N ranks of their (float32-accumulated) gradients
// g_r, sent as 16-bit floats: each g_r is rounded once on its rank, and the engine's reduction adds N-1
// times, rounding each partial sum once (in float32, then to 16 bits). Every rounding has a relative error
// of at most u, half the format's spacing: 2^-8 for bfloat16 (8 significant bits), 2^-11 for fp16 (11).
// The summands and the partial sums are at most Σ|g_r| in size, so the sum is off by at most N·u·Σ|g_r|
// and the mean by N·u·ā, ā the ranks' mean |g_r| (to first order in u). An SGD step moves a weight by
// lr·(mean), so its error is at most N·u·lr·ā. Assuming that a step of one rank's own gradient (lr·ā)
// moves no weight by more than the largest weight of its variable (here: three small SGD steps from the
// initialisation's scale), each step's error is at most N·u relative to the variable's scale, and S steps' at most S·N·u (the later
// steps' gradients change with the perturbed weights only at second order). For bfloat16 on 4 ranks over 3
// steps: 3·4·2^-8 ≈ 0.047; for fp16: 3·4·2^-11 ≈ 0.0059. The errors measured are 5 to 25 times smaller: the
// bound adds every rounding at its largest, with one sign.
func compressedTolerance(format accumulate.Compression, ranks, steps int) float64 {
	u := 0x1p-8
	if format == accumulate.FP16 {
		u = 0x1p-11
	}
	return float64(steps*ranks) * u
}

// compressedRun is one in-process training run: the ranks' results and rank 0's counters.
type compressedRun struct {
	results []testmodel.Result
	stats   accel.Stats
}

func trainInProcess(t *testing.T, ranks, k int, format accumulate.Compression, run testmodel.Run) compressedRun {
	out := compressedRun{results: make([]testmodel.Result, ranks)}
	runRanks(t, ranks, []accel.Option{accel.WithGradientAccumulationSteps(k), accel.WithGradientCompression(format)},
		func(rank int, acc *accel.Accelerator) error {
			var err error
			out.results[rank], err = run.Train(acc)
			if rank == 0 {
				out.stats = acc.Stats()
			}
			return err
		})
	return out
}

// TestCompressedEquivalence: with bf16 or fp16 compression, N ranks × K micro-batches × b examples of SGD
// end within compressedTolerance of one process taking one step per N·K·b examples (GoMLX's own trainer);
// every rank holds bitwise the same weights; the weights are not bitwise those of the same run
// uncompressed (the hook really ran), and each sync's all-reduces counted half the bytes.
func TestCompressedEquivalence(t *testing.T) {
	const b, steps = 4, 3
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	require.NoError(t, err)
	for _, format := range []accumulate.Compression{accumulate.BF16, accumulate.FP16} {
		for _, tc := range []struct{ ranks, k int }{{2, 1}, {2, 3}, {4, 1}, {4, 3}} {
			t.Run(fmt.Sprintf("%s/ranks=%d/K=%d", format, tc.ranks, tc.k), func(t *testing.T) {
				global := tc.ranks * tc.k * b
				inputs, labels := testmodel.Data(global*steps, 1)
				run := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: b}
				plain := trainInProcess(t, tc.ranks, tc.k, accumulate.NoCompression, run)
				compressed := trainInProcess(t, tc.ranks, tc.k, format, run)
				require.EqualValues(t, steps, compressed.results[0].Steps)

				ref := context.New()
				require.NoError(t, testmodel.CopyParams(ref, allVariables(compressed.results[0].Initial)))
				require.NoError(t, testmodel.ReferenceTrain(backend, ref, testmodel.SGD,
					testmodel.ReferenceBatches(inputs, labels, global, 1)))
				checkCompressed(t, format, tc.ranks, steps, ref, compressed.results[0].Model.Parameters(),
					plain.results[0].Model.Parameters())
				for r := 1; r < tc.ranks; r++ {
					same, name, err := testmodel.MaxRelativeError(compressed.results[r].Model.Parameters(),
						snapshotContext(t, compressed.results[0].Model.Parameters()))
					require.NoError(t, err)
					assert.Zero(t, same, "rank %d's %s differs from rank 0's", r, name)
				}
				checkHalfBytes(t, plain.stats, compressed.stats)
			})
		}
	}
}

// checkCompressed compares a compressed run's weights with the reference and with the uncompressed run.
func checkCompressed(t *testing.T, format accumulate.Compression, ranks, steps int, ref *context.Context, got, plain []*context.Variable) {
	t.Helper()
	worst, name, err := testmodel.MaxRelativeError(got, ref)
	require.NoError(t, err)
	tol := compressedTolerance(format, ranks, steps)
	assert.LessOrEqual(t, worst, tol, "variable %s", name)
	exact, _, err := testmodel.MaxRelativeError(plain, ref)
	require.NoError(t, err)
	assert.LessOrEqual(t, exact, 1e-5, "the uncompressed control")
	apart, _, err := testmodel.MaxRelativeError(got, snapshotContext(t, plain))
	require.NoError(t, err)
	assert.Positive(t, apart, "compressed weights are bitwise the uncompressed ones: the hook did not run")
	t.Logf("%s on %d ranks: %.3g from the reference (tolerance %.3g), %.3g from uncompressed", format, ranks,
		worst, tol, apart)
}

// checkHalfBytes: the same syncs, half the all-reduced bytes.
func checkHalfBytes(t *testing.T, plain, compressed accel.Stats) {
	t.Helper()
	require.Positive(t, compressed.Syncs)
	assert.Equal(t, plain.Syncs, compressed.Syncs)
	p, c := plain.Collectives.Of(backends.OpAllReduce), compressed.Collectives.Of(backends.OpAllReduce)
	assert.Equal(t, p.Calls, c.Calls, "the same all-reduces")
	assert.Equal(t, p.Bytes, 2*c.Bytes, "bytes per sync: %d uncompressed, %d compressed", p.Bytes/plain.Syncs,
		c.Bytes/compressed.Syncs)
}

func snapshotContext(t *testing.T, vars []*context.Variable) *context.Context {
	t.Helper()
	s, err := testmodel.TakeSnapshot(vars)
	require.NoError(t, err)
	return s.Context()
}

// compressedReport is what a rank of TestMPICompressedEquivalence reports, by format.
type compressedReport struct {
	Initial testmodel.Snapshot `json:"initial"`
	Final   testmodel.Snapshot `json:"final"`
	Stats   accel.Stats        `json:"stats"`
}

// TestMPICompressedEquivalence is TestCompressedEquivalence's check in real MPI jobs of 2 and 4 processes,
// where the 16-bit sums are the MPI engine's user-defined reductions: K=2, SGD, gradients uncompressed,
// then as bf16, then as fp16.
func TestMPICompressedEquivalence(t *testing.T) {
	const k, b, steps = 2, 2, 3
	formats := []accumulate.Compression{accumulate.NoCompression, accumulate.BF16, accumulate.FP16}
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(keeper *backends.Communicator) (any, error) {
			reports := map[string]compressedReport{}
			for _, format := range formats {
				inputs, labels := testmodel.Data(keeper.Size()*k*b*steps, 1)
				acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(k),
					accel.WithGradientCompression(format))
				if err != nil {
					return nil, err
				}
				res, err := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: b}.Train(acc)
				if err != nil {
					return nil, err
				}
				rep := compressedReport{Stats: acc.Stats()}
				if rep.Initial, err = testmodel.TakeSnapshot(allVariables(res.Initial)); err != nil {
					return nil, err
				}
				if rep.Final, err = testmodel.TakeSnapshot(res.Model.Parameters()); err != nil {
					return nil, err
				}
				reports[format.String()] = rep
				if err := acc.Close(); err != nil {
					return nil, err
				}
			}
			return reports, nil
		}))
		return
	}
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	require.NoError(t, err)
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, "TestMPICompressedEquivalence", mpitest.WithTimeout(3*time.Minute))
			reports := make([]map[string]compressedReport, np)
			for r, res := range results {
				require.NoError(t, res.Decode(&reports[r]))
			}
			plain := reports[0]["none"]
			inputs, labels := testmodel.Data(np*k*b*steps, 1)
			ref := plain.Initial.Context()
			require.NoError(t, testmodel.ReferenceTrain(backend, ref, testmodel.SGD,
				testmodel.ReferenceBatches(inputs, labels, np*k*b, 1)))
			for _, format := range formats[1:] {
				got := reports[0][format.String()]
				assert.Equal(t, plain.Initial, got.Initial)
				checkCompressed(t, format, np, steps, ref, allVariables(got.Final.Context()),
					allVariables(plain.Final.Context()))
				checkHalfBytes(t, plain.Stats, got.Stats)
				for r := 1; r < np; r++ {
					assert.Equal(t, got.Final, reports[r][format.String()].Final, "%s: rank %d's weights differ from rank 0's", format, r)
				}
			}
		})
	}
}

// TestCompressionReachesTheReducer: GOACCEL_GRADIENT_COMPRESSION (or the option, which wins) installs the
// compression hook on the models an Accelerator prepares.
func TestCompressionReachesTheReducer(t *testing.T) {
	for _, tc := range []struct {
		env  string
		opts []accel.Option
		want string
	}{
		{"", nil, "identity"},
		{"bf16", nil, "bf16 compression"},
		{"FP16", nil, "fp16 compression"},
		{"fp16", []accel.Option{accel.WithGradientCompression(accumulate.BF16)}, "bf16 compression"},
		{"bf16", []accel.Option{accel.WithGradientCompression(accumulate.NoCompression)}, "identity"},
	} {
		t.Run(fmt.Sprintf("%q", tc.env), func(t *testing.T) {
			clearConfigEnv(t)
			t.Setenv(accel.GradientCompressionEnvVar, tc.env)
			acc, err := accel.New(append([]accel.Option{accel.WithBackend("go")}, tc.opts...)...)
			require.NoError(t, err)
			defer acc.Close()
			model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			x, y := testmodel.Data(4, 1)
			require.NoError(t, model.Materialize(batchOf(x, y)))
			assert.Equal(t, tc.want, model.Reducer().CommHook().Name())
		})
	}
	_, err := accel.New(accel.WithGradientCompression(accumulate.Compression(7)))
	require.ErrorContains(t, err, "gradient compression must be accumulate.NoCompression, BF16 or FP16, got Compression(7)")
}

// With one process nothing travels, so compression changes nothing there; launched on several, every
// gradient bucket goes out as bfloat16.
func ExampleWithGradientCompression() {
	conf, err := accel.Resolve(accel.WithGradientCompression(accumulate.BF16))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(conf.GradientCompression)
	// Output: bf16
}
