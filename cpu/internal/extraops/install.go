package extraops

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

var (
	installMu sync.Mutex
	// patches add an executor for each op simplego lacks (it has none to replace).
	patches = []*gomlxpatch.ExecutorPatch{
		{OpType: backends.OpTypePad, Executor: execPad},
		{OpType: backends.OpTypeReverse, Executor: execReverse},
		{OpType: backends.OpTypeDynamicSlice, Executor: execDynamicSlice},
		{OpType: backends.OpTypeDynamicUpdateSlice, Executor: execDynamicUpdateSlice},
		{OpType: backends.OpTypeBatchNormForInference, Executor: execBatchNorm},
		{OpType: backends.OpTypeBatchNormForTraining, Executor: execBatchNorm},
		{OpType: backends.OpTypeBatchNormGradient, Executor: execBatchNorm},
	}
	// selfTested is set once selfTest passed: what it checks cannot change within a process.
	selfTested bool

	padCalls, reverseCalls, dynamicSliceCalls, dynamicUpdateSliceCalls, batchNormCalls atomic.Uint64
	groupedConvolutions, booleanWindows                                                atomic.Uint64
)

// Counts says how many operations this package ran or built since the process started; tests use it to
// check that its paths really ran.
type Counts struct {
	Pads, Reverses, DynamicSlices, DynamicUpdateSlices uint64 // executions
	BatchNorms                                         uint64 // executions of batch normalization nodes
	GroupedConvolutions                                uint64 // grouped ConvGenerals built as one per group
	BooleanWindows                                     uint64 // ReduceWindows of booleans built on uint8
}

// Calls returns the counts so far.
func Calls() Counts {
	return Counts{Pads: padCalls.Load(), Reverses: reverseCalls.Load(), DynamicSlices: dynamicSliceCalls.Load(),
		DynamicUpdateSlices: dynamicUpdateSliceCalls.Load(), BatchNorms: batchNormCalls.Load(),
		GroupedConvolutions: groupedConvolutions.Load(), BooleanWindows: booleanWindows.Load()}
}

// Install gives every simplego backend of the process executors for the ops Extend's builders add. It is
// idempotent; like the other executor patches it rewrites simplego's executor table, so it must not run
// concurrently with executions. It fails, leaving simplego untouched, when the GoMLX internals it relies on
// changed or the ops do not compute what they should.
func Install() error {
	installMu.Lock()
	defer installMu.Unlock()
	for _, patch := range patches {
		if _, err := patch.Install(); err != nil {
			gomlxpatch.UninstallAll(patches)
			return fmt.Errorf("extraops: %w", err)
		}
	}
	if selfTested {
		return nil
	}
	if err := selfTest(); err != nil {
		gomlxpatch.UninstallAll(patches)
		return fmt.Errorf("extraops: self-test: %w (GoMLX internals changed? written against GoMLX v0.26.0)", err)
	}
	selfTested = true
	return nil
}

// Uninstall removes the executors. Graphs built with the added ops then fail to run, as on simplego as
// shipped. Like Install, it must not run concurrently with executions.
func Uninstall() {
	installMu.Lock()
	defer installMu.Unlock()
	gomlxpatch.UninstallAll(patches)
}

// Installed reports whether the executors are in simplego's table.
func Installed() bool { return patches[0].Installed() }

func nodeDataAny(node *simplego.Node) any { return gomlxpatch.NodeData(node) }

func nodeShape(node *simplego.Node) (shapes.Shape, bool) { return gomlxpatch.NodeShape(node) }

// selfTest pads and reverses a small vector on a fresh simplego backend extended by this package, and
// checks the result: a broken patch fails Install instead of computing garbage.
func selfTest() error {
	inner, err := simplego.New("")
	if err != nil {
		return err
	}
	defer inner.Finalize()
	backend := Extend(inner)
	builder := backend.Builder("extraops_self_test")
	x, err := builder.Parameter("x", shapes.Make(dtypes.Int32, 3), nil)
	if err != nil {
		return err
	}
	zero, err := builder.Constant([]int32{0})
	if err != nil {
		return err
	}
	if zero, err = builder.Reshape(zero); err != nil {
		return err
	}
	reversed, err := builder.Reverse(x, 0)
	if err != nil {
		return err
	}
	padded, err := builder.Pad(reversed, zero, backends.PadAxis{Start: 1, End: -1, Interior: 1})
	if err != nil {
		return err
	}
	executable, err := builder.Compile([]backends.Op{padded}, nil)
	if err != nil {
		return err
	}
	defer executable.Finalize()
	input, err := backend.BufferFromFlatData(0, []int32{1, 2, 3}, shapes.Make(dtypes.Int32, 3))
	if err != nil {
		return err
	}
	outputs, err := executable.Execute([]backends.Buffer{input}, nil, 0)
	if err != nil {
		return err
	}
	got, err := backend.BufferData(outputs[0])
	if err != nil {
		return err
	}
	// [3 2 1], spaced [3 0 2 0 1], one zero before and the last element cut.
	if want := []int32{0, 3, 0, 2, 0}; !slices.Equal(got.([]int32), want) {
		return fmt.Errorf("Pad(Reverse([1 2 3])) gave %v, want %v", got, want)
	}
	for _, buffer := range outputs {
		_ = backend.BufferFinalize(buffer)
	}
	return nil
}
