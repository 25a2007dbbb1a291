package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
)

// The bucketing model has at least 100 gradient tensors of mixed sizes, about 20 MB, which the default plan
// packs into few buckets.
func TestBucketingModel(t *testing.T) {
	m := deepMLP()
	params := m.params()
	assert.GreaterOrEqual(t, len(params), 100)
	assert.InDelta(t, 21.9, float64(m.bytes())/(1<<20), 0.05)
	smallest, largest := params[0].Shape.Memory(), params[0].Shape.Memory()
	for _, p := range params {
		smallest, largest = min(smallest, p.Shape.Memory()), max(largest, p.Shape.Memory())
	}
	assert.EqualValues(t, 40, smallest)
	assert.EqualValues(t, 576*448*4, largest)
	plan, err := accumulate.NewPlan(params, 0, defaultBucketCapBytes)
	require.NoError(t, err)
	assert.Len(t, plan.Buckets, 2, "a 1 MB first bucket, then everything else under the 25 MB cap")
	assert.Equal(t, m.bytes(), plan.TotalBytes())
}

func TestBagOfWordsModel(t *testing.T) {
	cfg := bagOfWords()
	params := cfg.Model.params()
	require.Len(t, params, 5)
	assert.Equal(t, "/embedding/embeddings", params[0].Name)
	assert.InDelta(t, 8.0, float64(cfg.Model.bytes())/(1<<20), 0.05, "several MB of gradients")
	batches := cfg.Model.batches(3, cfg.Batch, 1)
	require.Len(t, batches, 3)
	assert.Equal(t, []int{cfg.Batch, cfg.Model.Tokens}, batches[0].Inputs[0].Shape().Dimensions)
	assert.Equal(t, []int{cfg.Batch, 1}, batches[0].Labels[0].Shape().Dimensions)
}
