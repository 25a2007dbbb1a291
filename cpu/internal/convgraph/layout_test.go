package convgraph

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

func TestCheckCompatible(t *testing.T) {
	require.NoError(t, CheckCompatible(), "GoMLX no longer stores node parameters where convgraph reads them")
}

// TestProbeDetectsChangedLayout feeds the compatibility probe readers that behave as they would if GoMLX
// renamed, reordered or retyped the fields read: each must make the probe fail.
func TestProbeDetectsChangedLayout(t *testing.T) {
	swappedConv := func(node *graph.Node) (convParams, error) {
		p, err := readConvParams(node)
		p.strides, p.kernelDilations = p.kernelDilations, p.strides
		return p, err
	}
	renamedConv := func(node *graph.Node) (convParams, error) {
		r, err := gomlxpatch.NewParamsReader(node, convGeneralInputsTypeName)
		if err != nil {
			return convParams{}, err
		}
		p := convParams{strides: r.Ints("windowStrides")}
		return p, r.Err
	}
	swappedPool := func(node *graph.Node) (poolParams, error) {
		p, err := readPoolParams(node)
		p.windowDimensions, p.strides = p.strides, p.windowDimensions
		return p, err
	}
	retypedPool := func(node *graph.Node) (poolParams, error) {
		r, err := gomlxpatch.NewParamsReader(node, reduceWindowInputsTypeName)
		if err != nil {
			return poolParams{}, err
		}
		p := poolParams{reduction: backends.ReduceOpType(r.TypedInt(poolReductionTypeField, reflect.TypeFor[int]()))}
		return p, r.Err
	}
	for _, c := range []struct {
		name     string
		readConv func(*graph.Node) (convParams, error)
		readPool func(*graph.Node) (poolParams, error)
		wantErr  string
	}{
		{"as-is", readConvParams, readPoolParams, ""},
		{"conv/swapped-fields", swappedConv, readPoolParams, "reads back as"},
		{"conv/renamed-field", renamedConv, readPoolParams, `no field "windowStrides"`},
		{"pool/swapped-fields", readConvParams, swappedPool, "reads back as"},
		{"pool/retyped-field", readConvParams, retypedPool, "not a int"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := probeCompatibility(c.readConv, c.readPool)
			if c.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.wantErr)
		})
	}
}

// TestParamsReaderRejectsWrongKinds reads a look-alike struct whose fields have the expected names but not
// the expected types.
func TestParamsReaderRejectsWrongKinds(t *testing.T) {
	type lookAlike struct {
		strides  []float64
		paddings [][3]int
		axes     struct{ InputBatch int }
		count    int32
	}
	value := reflect.ValueOf(lookAlike{})
	for _, c := range []struct {
		name    string
		read    func(r *gomlxpatch.ParamsReader)
		wantErr string
	}{
		{"ints", func(r *gomlxpatch.ParamsReader) { r.Ints("strides") }, "not a []int"},
		{"pairs", func(r *gomlxpatch.ParamsReader) { r.Pairs("paddings") }, "not a [][2]int"},
		{"axes", func(r *gomlxpatch.ParamsReader) { readConvolveAxes(r, "axes") }, "not a backends.ConvolveAxesConfig"},
		{"int", func(r *gomlxpatch.ParamsReader) { r.Int("count") }, "not a int"},
		{"missing", func(r *gomlxpatch.ParamsReader) { r.Ints("dilations") }, `no field "dilations"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &gomlxpatch.ParamsReader{Params: value}
			c.read(r)
			require.Error(t, r.Err)
			assert.Contains(t, r.Err.Error(), c.wantErr)
		})
	}
}

func TestReadParamsOfOtherNodeFails(t *testing.T) {
	g := graph.NewGraph(computetest.PureGo(t), "other_node")
	defer g.Finalize()
	x := graph.Parameter(g, "x", shapes.Make(dtypes.Float32, 2, 4, 4, 3))
	pooled := graph.MaxPool(x).Window(2).Done()
	_, err := readConvParams(pooled)
	require.Error(t, err)
	assert.Contains(t, err.Error(), convGeneralInputsTypeName)
	_, err = readPoolParams(x)
	require.Error(t, err)
	assert.Contains(t, err.Error(), reduceWindowInputsTypeName)
}

// TestRegisterPanicsWhenIncompatible checks that Register refuses, loudly, to install gradients that would
// read parameters from the wrong place.
func TestRegisterPanicsWhenIncompatible(t *testing.T) {
	Unregister()
	saved := compatibility
	defer func() { compatibility = saved }()
	compatibility = func() error { return errors.New("convgraph: graph.Node has no field \"inputs\"") }
	require.PanicsWithValue(t, `convgraph.Register: convgraph: graph.Node has no field "inputs"`, Register)
	require.False(t, Registered())
}
