// Package floats runs code over the flat data of float32 and float64 tensors (gradient buckets) with one
// type switch, written here.
package floats

// Float is the element types of gradient buckets.
type Float interface{ float32 | float64 }

// Do calls f32 or f64 with flat, the flat data of a float32 or float64 tensor, and returns its
// result; for any other flat data it returns false without calling either. Pass the two instances of one
// generic function (floats.Do(flat, sum[float32], sum[float64])): the type switch over a tensor's flat
// data is then written once, here.
func Do(flat any, f32 func([]float32) bool, f64 func([]float64) bool) bool {
	switch f := flat.(type) {
	case []float32:
		return f32(f)
	case []float64:
		return f64(f)
	}
	return false
}

// Scale multiplies flat float data by factor, in place.
func Scale(flat any, factor float64) {
	Do(flat, scale[float32](factor), scale[float64](factor))
}

func scale[F Float](factor float64) func([]F) bool {
	return func(x []F) bool {
		for i := range x {
			x[i] *= F(factor)
		}
		return true
	}
}
