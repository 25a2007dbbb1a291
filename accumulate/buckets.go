package accumulate

import "fmt"

// EachAccumulator runs f32 on each float32 bucket accumulator's values and f64 on each float64 one, in
// place: on a backend whose buffers are host memory the slice is the backend's own buffer (no copy to the
// host and back, see hostFlat), elsewhere a host copy that the next graph execution uploads. The functions
// may change the values (gradient clipping does); they must not keep the slice.
func (r *Reducer) EachAccumulator(f32 func([]float32), f64 func([]float64)) error {
	for b, v := range r.accumulators {
		t, err := v.Value()
		if err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
		flat, err := hostFlat(t)
		if err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
		switch values := flat.(type) {
		case []float32:
			f32(values)
		case []float64:
			f64(values)
		default:
			return fmt.Errorf("accumulate: accumulator %d holds %T, not float32 or float64 values", b, flat)
		}
	}
	return nil
}
