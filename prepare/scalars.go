package prepare

import (
	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// maxDeviceScalars bounds a deviceScalars cache: a job uses a handful of values (1/K, the short-cycle
// corrections, true and false), so more means values that do not repeat, and caching them would only grow.
const maxDeviceScalars = 32

// deviceScalars holds the scalar arguments of compiled steps as tensors already on the backend's device,
// one per value. A scalar made with tensors.FromScalar for every call is a host tensor: each execution
// then copies it into a device buffer and, in GoMLX v0.26.0, first builds (and drops) an error with a stack
// trace while checking where the tensor lives — per micro-batch, two of them, a measurable share of a small
// model's step.
type deviceScalars struct {
	backend gomlxbackends.Backend
	byValue map[any]*tensors.Tensor
}

// get returns value (a float64 or a bool) as a device tensor, or as a host tensor if the backend refuses.
func (c *deviceScalars) get(value any) *tensors.Tensor {
	if t, ok := c.byValue[value]; ok {
		return t
	}
	var t *tensors.Tensor
	switch v := value.(type) {
	case float64:
		t = tensors.FromScalar(v)
	case bool:
		t = tensors.FromScalar(v)
	default:
		panic("prepare: device scalars are float64 or bool")
	}
	if c.backend == nil || t.MaterializeOnDevice(c.backend, true, 0) != nil {
		return t
	}
	if c.byValue == nil || len(c.byValue) >= maxDeviceScalars {
		c.byValue = map[any]*tensors.Tensor{}
	}
	c.byValue[value] = t
	return t
}
