package accel_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/internal/replicas"
)

// TestPowerSGDTrains: with PowerSGD on 2 and 4 processes training moves the weights, every process holds
// the same ones, the hook counts compressed syncs and a compression ratio above 1, and what the
// communicator sent per compressed sync is what the ratio says; a checkpoint of 2 processes resumes on 4
// (the errors start at zero there, the Qs and the count carry over).
func TestPowerSGDTrains(t *testing.T) {
	dir := t.TempDir()
	cfg := accumulate.PowerSGDConfig{Rank: 1, StartIter: 2}
	for _, ranks := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d processes", ranks), func(t *testing.T) {
			digests := make([][32]byte, ranks)
			stats := make([]accel.Stats, ranks)
			runRanks(t, ranks, []accel.Option{accel.WithPowerSGD(cfg), accel.WithSeed(3)}, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, 64, 2, 1)
				if ranks == 4 {
					if err := acc.LoadState(dir); err != nil {
						return err
					}
				}
				// 2 processes train epoch 0 and save; 4 resume there and train epoch 1.
				if _, err := r.trainCurve(acc, ranks/2, 0); err != nil {
					return err
				}
				stats[rank] = acc.Stats()
				var err error
				digests[rank], err = replicas.VariablesDigest(r.model.ReplicatedVariables())
				if err == nil && ranks == 2 {
					_, err = acc.SaveState(dir)
				}
				return err
			})
			for rank := range ranks {
				assert.Equal(t, digests[0], digests[rank])
			}
			s := stats[0].CommHook
			assert.Positive(t, s.CompressedSyncs)
			assert.Greater(t, s.Ratio(), 1.5, "the test MLP's two weight matrices travel as rank-1 factors")
			// One sync per optimizer step: 64/(2·2) in epoch 0, then 64/(4·2) more after the resume on 4.
			want := int64(64 / (2 * 2))
			if ranks == 4 {
				want += 64 / (4 * 2)
			}
			assert.EqualValues(t, want, s.Syncs, "the count carried over the resume")
			assert.EqualValues(t, want-int64(cfg.StartIter), s.CompressedSyncs)
		})
	}
}

// TestPowerSGDRefusesCombinations: PowerSGD is one comm hook: not with gradient compression, a sharding
// strategy or sync-each-batch; and its configuration is checked.
func TestPowerSGDRefusesCombinations(t *testing.T) {
	cfg := accumulate.PowerSGDConfig{Rank: 2}
	for _, tc := range []struct {
		opts []accel.Option
		want string
	}{
		{[]accel.Option{accel.WithGradientCompression(accumulate.BF16)}, "two comm hooks"},
		{[]accel.Option{accel.WithSharding(accel.ShardOptimizer)}, "sharding strategy"},
		{[]accel.Option{accel.WithSyncEachBatch()}, "sync-each-batch"},
		{[]accel.Option{accel.WithLocalSGD(4)}, "nothing to compress"},
	} {
		_, err := accel.Resolve(append(tc.opts, accel.WithPowerSGD(cfg))...)
		assert.ErrorContains(t, err, tc.want)
	}
	_, err := accel.Resolve(accel.WithPowerSGD(accumulate.PowerSGDConfig{Rank: -2}))
	assert.ErrorContains(t, err, "rank must be from 1")
	opts, err := accel.OptionsFromEnv(func(name string) (string, bool) {
		if name == accel.PowerSGDEnvVar {
			return "4:100", true
		}
		return "", false
	})
	require.NoError(t, err)
	conf, err := accel.Resolve(opts...)
	require.NoError(t, err)
	require.NotNil(t, conf.PowerSGD)
	assert.Equal(t, 4, conf.PowerSGD.Rank)
	assert.Equal(t, 100, conf.PowerSGD.StartIter)
}

// PowerSGD's configuration as a job resolves it from GOACCEL_POWERSGD=RANK:START.
func ExampleWithPowerSGD() {
	conf, err := accel.Resolve(accel.WithPowerSGD(accumulate.PowerSGDConfig{Rank: 4, StartIter: 100}))
	if err != nil {
		fmt.Println(err)
		return
	}
	hook, err := accumulate.NewPowerSGDHook(*conf.PowerSGD)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(hook.Name())
	// Output: powersgd(rank=4, start=100, min-rate=2, warm-start=true, error-feedback=true, seed=0)
}
