package gomlxpatch

import (
	"reflect"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type mirroredParams struct{ a, b []int }

// TestDataMirrorRejectsForeignTypes checks that node data of an unexpected type is reported, not read.
func TestDataMirrorRejectsForeignTypes(t *testing.T) {
	m := DataMirror[mirroredParams]{TypeName: "dotGeneralNodeData"}
	assert.Error(t, m.check(nil))
	assert.Error(t, m.check(reflect.TypeOf(&mirroredParams{})), "a struct from another package must not be accepted as simplego's")
	assert.Error(t, m.check(reflect.TypeOf(3)))
}

// TestNewNodeRoundTrip creates a node of an op simplego does not implement, with parameters, and reads
// them back as an executor would.
func TestNewNodeRoundTrip(t *testing.T) {
	backend, err := simplego.New("")
	require.NoError(t, err)
	defer backend.Finalize()
	builder := backend.Builder("round_trip")
	x, err := builder.Parameter("x", shapes.Make(dtypes.Float32, 2, 3), nil)
	require.NoError(t, err)
	params := &mirroredParams{a: []int{1, 2}}
	op, err := NewNode(builder, backends.OpTypeSelectAndScatterMax, shapes.Make(dtypes.Float32, 2, 3), params, x)
	require.NoError(t, err)
	assert.Same(t, params, NodeData(op.(*simplego.Node)))
	shape, err := builder.OpShape(op)
	require.NoError(t, err)
	assert.Equal(t, shapes.Make(dtypes.Float32, 2, 3), shape)

	_, err = NewNode(builder, backends.OpTypeSelectAndScatterMax, shape, nil, "not an op")
	assert.Error(t, err)
}

// TestInstallReplacingLeavesInstalledPatchesAlone: installing patches that are already installed hands
// nothing to keep again (their executors may be reading what keep stored, on another goroutine), and
// after an uninstall the next install does.
func TestInstallReplacingLeavesInstalledPatchesAlone(t *testing.T) {
	original, _ := CurrentExecutor(backends.OpTypeCos)
	require.NotNil(t, original, "simplego implements Cos")
	patches := []*ExecutorPatch{{OpType: backends.OpTypeCos, Executor: func(*simplego.Backend, *simplego.Node,
		[]*simplego.Buffer, []bool) (*simplego.Buffer, error) {
		return nil, nil
	}}}
	kept := 0
	keep := func(opType backends.OpType, replaced Executor) {
		assert.Equal(t, backends.OpTypeCos, opType)
		assert.Equal(t, reflect.ValueOf(original).Pointer(), reflect.ValueOf(replaced).Pointer())
		kept++
	}
	defer UninstallAll(patches)
	require.NoError(t, InstallReplacing(patches, keep))
	require.NoError(t, InstallReplacing(patches, keep))
	assert.Equal(t, 1, kept, "keep called again for an installed patch")
	UninstallAll(patches)
	restored, _ := CurrentExecutor(backends.OpTypeCos)
	assert.Equal(t, reflect.ValueOf(original).Pointer(), reflect.ValueOf(restored).Pointer())
	require.NoError(t, InstallReplacing(patches, keep))
	assert.Equal(t, 2, kept)
}
