package convkernel

import (
	"fmt"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// selfTest runs one small convolution on a fresh simplego backend and checks its result and that it went
// through the kernel, so that a broken patch fails Install instead of computing garbage or silently
// leaving simplego's loops in place.
func selfTest() (err error) {
	defer func() {
		if err != nil {
			uninstallLocked()
			err = fmt.Errorf("convkernel: self-test: %w (GoMLX internals changed? written against GoMLX v0.26.0)", err)
		}
	}()
	backend, err := simplego.New("")
	if err != nil {
		return err
	}
	defer backend.Finalize()
	builder := backend.Builder("convkernel_self_test")
	// A 3×3 single-channel image convolved with a 2×2 kernel of two output channels (channels last).
	input, err := builder.Parameter("input", shapes.Make(dtypes.Float32, 1, 3, 3, 1), nil)
	if err != nil {
		return err
	}
	kernel, err := builder.Parameter("kernel", shapes.Make(dtypes.Float32, 2, 2, 1, 2), nil)
	if err != nil {
		return err
	}
	axes := backends.ConvolveAxesConfig{InputBatch: 0, InputSpatial: []int{1, 2}, InputChannels: 3,
		KernelSpatial: []int{0, 1}, KernelInputChannels: 2, KernelOutputChannels: 3,
		OutputBatch: 0, OutputSpatial: []int{1, 2}, OutputChannels: 3}
	conv, err := builder.ConvGeneral(input, kernel, axes, []int{1, 1}, nil, nil, nil, 1, 1)
	if err != nil {
		return err
	}
	executable, err := builder.Compile([]backends.Op{conv}, nil)
	if err != nil {
		return err
	}
	defer executable.Finalize()
	inputBuffer, err := backend.BufferFromFlatData(0, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}, shapes.Make(dtypes.Float32, 1, 3, 3, 1))
	if err != nil {
		return err
	}
	// Output channel 0 sums the window, channel 1 takes its top-left element.
	kernelBuffer, err := backend.BufferFromFlatData(0, []float32{1, 1, 1, 0, 1, 0, 1, 0}, shapes.Make(dtypes.Float32, 2, 2, 1, 2))
	if err != nil {
		return err
	}
	before := Calls().Convolutions
	outputs, err := executable.Execute([]backends.Buffer{inputBuffer, kernelBuffer}, nil, 0)
	if err != nil {
		return err
	}
	got := make([]float32, 8)
	if err := backend.BufferToFlatData(outputs[0], got); err != nil {
		return err
	}
	if mirrorErr := convMirror.Err(); mirrorErr != nil {
		return mirrorErr
	}
	if Calls().Convolutions == before {
		return fmt.Errorf("the convolution did not reach the kernel after patching simplego's executor table")
	}
	want := []float32{12, 1, 16, 2, 24, 4, 28, 5}
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("convolution gave %v, want %v", got, want)
		}
	}
	return nil
}
