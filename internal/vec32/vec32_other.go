//go:build !amd64 || purego

package vec32

// Without assembly (other architectures, and builds with the purego tag) every loop is generic.go's.
var accelerated = false

// wide is never true here: there are no AVX-512 kernels to run.
var wide = false

func binaryAccel(Op, []float32, []float32, []float32) int        { return 0 }
func binaryScalarAccel(Op, []float32, []float32, float32) int    { return 0 }
func scalarBinaryAccel(Op, []float32, float32, []float32) int    { return 0 }
func unaryAccel(Unary, []float32, []float32) int                 { return 0 }
func selectAccel([]float32, []float32, []float32, []float32) int { return 0 }

func scatter4Accel(float32, []float32, []float32, []float32, []float32, []float32, []float32, []float32,
	[]float32, []float32) int {
	return 0
}

func foldAccel(fold, []float32, *[lanes]float32) bool { return false }

func combineAccel(fold, *[lanes]float32) (float32, bool) { return 0, false }

func fromBoolAccel([]float32, []bool) int { return 0 }

func fillAccel([]float32, float32) int { return 0 }

func poolRowAccel(bool, []float32, []float32, int, int, int) bool { return false }

func scatterPoolRowAccel(float32, []float32, []float32, []float32, int, int, int) bool { return false }

func sumSquaresAccel([]float32, *[16]float64) bool { return false }

func scaleDevAccel(_, _, _, _, _ []float32) int         { return 0 }
func combineDevAccel(_, _, _, _, _, _, _ []float32) int { return 0 }
func shiftedMomentsAccel(_, _, _, _ []float32) int      { return 0 }
func gradientMomentsAccel(_, _, _, _, _ []float32) int  { return 0 }

func lnSquaresAccel([]float32, float32, *[lanes]float32) bool                   { return false }
func lnOutAccel(_, _, _, _ []float32, _, _ float32) bool                        { return false }
func lnProductAccel(_, _, _ []float32, _, _ float32) bool                       { return false }
func lnGradDevAccel(_, _, _ []float32, _, _ float32, _ *[lanes]float32) bool    { return false }
func lnGradSumAccel(_, _, _ []float32, _, _, _ float32, _ *[lanes]float32) bool { return false }
func lnGradOutAccel(_, _, _, _, _ []float32, _, _, _, _ float32) bool           { return false }
