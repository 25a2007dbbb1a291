package prepare_test

import (
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/prepare"
)

// TestFreshAccumulatorsAreBitwiseTheSame trains the same model with the first micro-batch of each cycle
// setting the accumulators (they hold zeros) and with every micro-batch adding into them: the weights after
// several steps are the same to the bit, for K = 1 (every micro-batch fresh) and K = 3. Either way the
// gradients read as zeros after the last step.
func TestFreshAccumulatorsAreBitwiseTheSame(t *testing.T) {
	for _, k := range []int{1, 3} {
		train := func(fresh bool) map[string][]float32 {
			defer prepare.SetFreshAccumulators(fresh)()
			backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo})
			require.NoError(t, err)
			state, err := accumulate.NewGradientState(k, false)
			require.NoError(t, err)
			rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
			ctx := context.New()
			require.NoError(t, ctx.SetRNGStateFromSeed(5))
			model, err := prepare.NewModel(rt, ctx, func(ctx *context.Context, in []*Node) []*Node {
				h := Tanh(layers.Dense(ctx.In("hidden"), in[0], true, 7))
				return []*Node{layers.Dense(ctx.In("out"), h, true, 2)}
			}, losses.MeanSquaredError)
			require.NoError(t, err)
			opt, err := prepare.NewOptimizer(model, optimizers.Adam().Done())
			require.NoError(t, err)
			for i := range 4 * k {
				x := make([][]float32, 5)
				y := make([][]float32, 5)
				for r := range x {
					x[r] = []float32{float32(i%3) - 1, float32(r) / 5, 0.5, float32(i*r%7) / 7}
					y[r] = []float32{float32(r%2) - 0.5, float32(i%4) / 4}
				}
				batch := prepare.Batch{Inputs: []*tensors.Tensor{tensors.FromValue(x)},
					Labels: []*tensors.Tensor{tensors.FromValue(y)}}
				require.NoError(t, state.Accumulate(func() error {
					if _, err := model.Backward(batch, state.MicroBatchScale()); err != nil {
						return err
					}
					if _, err := opt.Step(); err != nil {
						return err
					}
					return opt.ZeroGrad()
				}))
			}
			weights := map[string][]float32{}
			for v := range ctx.IterVariables() {
				if v.Trainable {
					value, err := v.Value()
					require.NoError(t, err)
					weights[v.ScopeAndName()] = tensors.MustCopyFlatData[float32](value)
				}
			}
			require.Equal(t, int64(4), opt.Steps())
			// The step left its sums in the accumulators for the next micro-batch to overwrite; they read
			// as zeros.
			grads, err := model.Gradients()
			require.NoError(t, err)
			require.NotEmpty(t, grads)
			for name, grad := range grads {
				for _, g := range tensors.MustCopyFlatData[float32](grad) {
					require.Zero(t, g, "%s, K=%d, fresh=%v", name, k, fresh)
				}
			}
			return weights
		}
		assert.Equal(t, train(false), train(true), "K=%d", k)
	}
}
