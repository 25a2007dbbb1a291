package gomlxpatch

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unusedNodeType is a node type no VJP is registered for.
const unusedNodeType = graph.NodeType(1 << 30)

func TestVJPPatchRemovesWhatItAdded(t *testing.T) {
	_, existed := graph.VJPRegistration[unusedNodeType]
	require.False(t, existed)
	var gotReplaced []graph.VJP
	installed := func(*graph.Node, []*graph.Node, shapes.Shape) []*graph.Node { return nil }
	p := &VJPPatch{Name: "test", VJPs: map[graph.NodeType]func(graph.VJP) graph.VJP{
		unusedNodeType: func(replaced graph.VJP) graph.VJP {
			gotReplaced = append(gotReplaced, replaced)
			return installed
		},
	}}
	p.Register()
	p.Register()
	require.True(t, p.Registered())
	require.Len(t, gotReplaced, 1)
	assert.Nil(t, gotReplaced[0])
	assert.Nil(t, p.Replaced(unusedNodeType))
	assert.Equal(t, reflect.ValueOf(installed).Pointer(), reflect.ValueOf(graph.VJPRegistration[unusedNodeType]).Pointer())

	p.Unregister()
	require.False(t, p.Registered())
	_, exists := graph.VJPRegistration[unusedNodeType]
	assert.False(t, exists, "Unregister must delete an entry Register added")
}

func TestVJPPatchPanicsWhenCheckFails(t *testing.T) {
	p := &VJPPatch{Name: "test", Check: func() error { return errors.New("changed") },
		VJPs: map[graph.NodeType]func(graph.VJP) graph.VJP{unusedNodeType: func(graph.VJP) graph.VJP { return nil }}}
	require.PanicsWithValue(t, "test.Register: changed", p.Register)
	require.False(t, p.Registered())
	_, exists := graph.VJPRegistration[unusedNodeType]
	assert.False(t, exists)
}

func TestWithFallback(t *testing.T) {
	leaveAll := func(*graph.Node, []*graph.Node, shapes.Shape) ([]*graph.Node, bool) { return nil, false }
	fallbackCalls := 0
	fallback := func(*graph.Node, []*graph.Node, shapes.Shape) []*graph.Node { fallbackCalls++; return nil }
	WithFallback("test", leaveAll, fallback)(nil, nil, shapes.Shape{})
	assert.Equal(t, 1, fallbackCalls)

	handleAll := func(*graph.Node, []*graph.Node, shapes.Shape) ([]*graph.Node, bool) { return nil, true }
	WithFallback("test", handleAll, fallback)(nil, nil, shapes.Shape{})
	assert.Equal(t, 1, fallbackCalls)
}

func TestParamsReaderRecordsFirstError(t *testing.T) {
	type params struct {
		window []int
		count  int
	}
	r := &ParamsReader{Params: reflect.ValueOf(params{window: []int{2, 3}, count: 4})}
	assert.Equal(t, []int{2, 3}, r.Ints("window"))
	assert.Equal(t, 4, r.Int("count"))
	require.NoError(t, r.Err)
	r.Ints("missing")
	r.Int("other")
	require.Error(t, r.Err)
	assert.Contains(t, r.Err.Error(), `no field "missing"`)
}

func TestProbeReportsPanics(t *testing.T) {
	err := Probe("test", "node parameters", func(*graph.Graph) error { panic("boom") })
	require.Error(t, err)
	assert.Equal(t, "test: building the compatibility probe: boom", err.Error())
	require.NoError(t, Probe("test", "node parameters", func(g *graph.Graph) error {
		require.NotNil(t, g)
		return nil
	}))
}
