package prepare

import (
	"math"
	"testing"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDeviceScalars: each value is made once, on the device, and served again; without a backend the
// value comes back as a host tensor; values that never repeat cannot grow the cache without bound.
func TestDeviceScalars(t *testing.T) {
	c := deviceScalars{backend: simplego.GetBackend()}
	for _, value := range []any{0.25, true, false, 1.0} {
		first := c.get(value)
		require.True(t, first.IsOnDevice(0), "%v", value)
		assert.Same(t, first, c.get(value), "%v is made once", value)
		assert.Equal(t, value, first.Value())
	}
	assert.NotSame(t, c.get(0.25), c.get(0.5))

	for i := range 10 * maxDeviceScalars {
		c.get(float64(i))
	}
	assert.LessOrEqual(t, len(c.byValue), maxDeviceScalars)
	assert.True(t, math.IsNaN(c.get(math.NaN()).Value().(float64)))

	host := (&deviceScalars{}).get(0.5)
	assert.True(t, host.IsLocal())
	assert.Equal(t, 0.5, tensors.ToScalar[float64](host))
}
