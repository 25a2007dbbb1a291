package accumulate

import "fmt"

// EachAccumulator runs fn on each bucket accumulator's flat values ([]float32 or []float64), in place: on a
// backend whose buffers are host memory the slice is the backend's own buffer (no copy to the host and
// back, see hostFlat), elsewhere a host copy that the next graph execution uploads. fn may change the values
// (gradient clipping does); it must not keep the slice.
func (r *Reducer) EachAccumulator(fn func(flat any)) error {
	for b, v := range r.accumulators {
		t, err := v.Value()
		if err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
		flat, err := hostFlat(t)
		if err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
		fn(flat)
	}
	return nil
}
