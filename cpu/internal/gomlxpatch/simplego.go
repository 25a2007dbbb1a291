package gomlxpatch

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe" // Required by //go:linkname, and to read and write simplego.Node's data field.

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// The pure-Go backend (simplego, GoMLX v0.26.0) runs every node through an executor looked up by op type in
// an unexported table, and keeps an op's static parameters in the unexported field Node.data. goaccel's
// kernels replace table entries (DotGeneral, ConvGeneral, ReduceWindow) and add entries for ops simplego
// leaves unimplemented (SelectAndScatterMax/Min): what follows is the one place that reaches those
// internals. A GoMLX whose simplego exposed executor registration and node creation would retire it.

// Executor has the signature of simplego's unexported nodeExecutor type, the element type of its executor
// table. A named func type with the same signature has the same memory representation, which is what the
// linkname pull below relies on; CheckSimplegoLayout guards the rest.
type Executor func(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error)

// simplegoExecutors is simplego's nodeExecutors table: the executor simplego calls for each op type, read
// at every node execution. There is no exported hook to replace an entry, hence the linkname.
//
//go:linkname simplegoExecutors github.com/gomlx/gomlx/backends/simplego.nodeExecutors
var simplegoExecutors [backends.OpTypeLast]Executor

// simplegoExecutorPriorities is simplego's nodeExecutorsPriority table (its registerPriority has int as
// underlying type). A patch raises its entry to priorityUser, as simplego's own setNodeExecutor would, so
// that a later registration at a lower priority does not undo it.
//
//go:linkname simplegoExecutorPriorities github.com/gomlx/gomlx/backends/simplego.nodeExecutorsPriority
var simplegoExecutorPriorities [backends.OpTypeLast]int

// simplegoNewNode is simplego's (*Builder).newNode: it appends a node of the given op type and output shape
// to the builder's graph. Ops simplego leaves unimplemented get their nodes this way.
//
//go:linkname simplegoNewNode github.com/gomlx/gomlx/backends/simplego.(*Builder).newNode
func simplegoNewNode(b *simplego.Builder, opType backends.OpType, shape shapes.Shape, inputs ...*simplego.Node) *simplego.Node

// PriorityUser mirrors simplego's priorityUser, the level reserved for user overrides.
const PriorityUser = 100

var (
	// executorsMu serialises patches of simplego's executor table (each patch must still not run
	// concurrently with executions: simplego reads the table without synchronisation).
	executorsMu sync.Mutex
	// nodeDataOffset and nodeShapeOffset are the offsets of simplego.Node's `data any` and
	// `shape shapes.Shape` fields, set by CheckSimplegoLayout; nodeInputsOffset, nodeOpTypeOffset and
	// nodeMultiOutputOffset those of `inputs []*Node`, `opType backends.OpType` and
	// `multiOutputsShapes []shapes.Shape`, which the graph rewriting of package fusion reads and writes.
	nodeDataOffset, nodeShapeOffset                           uintptr
	nodeInputsOffset, nodeOpTypeOffset, nodeMultiOutputOffset uintptr
	layoutOnce                                                sync.Once
	layoutErr                                                 error
)

// CheckSimplegoLayout verifies that simplego.Node still has the `data any` field this package reads and
// writes, and remembers where it is. Every accessor below calls it first.
func CheckSimplegoLayout() error {
	layoutOnce.Do(func() {
		field, found := reflect.TypeFor[simplego.Node]().FieldByName("data")
		switch {
		case !found:
			layoutErr = fmt.Errorf("simplego.Node has no field \"data\" (GoMLX internals changed; written against GoMLX v0.26.0)")
		case field.Type != reflect.TypeFor[any]():
			layoutErr = fmt.Errorf("simplego.Node.data has type %s, expected any (GoMLX internals changed; "+
				"written against GoMLX v0.26.0)", field.Type)
		default:
			nodeDataOffset = field.Offset
		}
		if layoutErr != nil {
			return
		}
		shapeField, found := reflect.TypeFor[simplego.Node]().FieldByName("shape")
		if !found || shapeField.Type != reflect.TypeFor[shapes.Shape]() {
			layoutErr = fmt.Errorf("simplego.Node has no field \"shape\" of type shapes.Shape (GoMLX internals " +
				"changed; written against GoMLX v0.26.0)")
			return
		}
		nodeShapeOffset = shapeField.Offset
		for _, f := range []struct {
			name   string
			typ    reflect.Type
			offset *uintptr
		}{
			{"inputs", reflect.TypeFor[[]*simplego.Node](), &nodeInputsOffset},
			{"opType", reflect.TypeFor[backends.OpType](), &nodeOpTypeOffset},
			{"multiOutputsShapes", reflect.TypeFor[[]shapes.Shape](), &nodeMultiOutputOffset},
		} {
			field, found := reflect.TypeFor[simplego.Node]().FieldByName(f.name)
			if !found || field.Type != f.typ {
				layoutErr = fmt.Errorf("simplego.Node has no field %q of type %s (GoMLX internals changed; written "+
					"against GoMLX v0.26.0)", f.name, f.typ)
				return
			}
			*f.offset = field.Offset
		}
	})
	return layoutErr
}

// ExecutorPatch replaces (or adds) simplego's executor for one op type and restores what was there.
type ExecutorPatch struct {
	OpType   backends.OpType
	Executor Executor

	// replaced and replacedPriority are the entry found at Install, restored by Uninstall.
	replaced         Executor
	replacedPriority int
	installed        bool
}

// Install puts the executor in simplego's table and returns the one it replaced (nil for an op simplego
// does not implement). It is idempotent. It fails, leaving the table alone, when the entry's priority is
// outside what simplego uses (the table's layout changed).
func (p *ExecutorPatch) Install() (replaced Executor, err error) {
	executorsMu.Lock()
	defer executorsMu.Unlock()
	if p.installed {
		return p.replaced, nil
	}
	if err := CheckSimplegoLayout(); err != nil {
		return nil, err
	}
	priority := simplegoExecutorPriorities[p.OpType]
	if priority < 0 || priority > PriorityUser {
		return nil, fmt.Errorf("simplego's executor table has an unexpected priority (%d) for %s (GoMLX "+
			"internals changed; written against GoMLX v0.26.0)", priority, p.OpType)
	}
	p.replaced, p.replacedPriority = simplegoExecutors[p.OpType], priority
	simplegoExecutors[p.OpType] = p.Executor
	simplegoExecutorPriorities[p.OpType] = PriorityUser
	p.installed = true
	return p.replaced, nil
}

// Uninstall restores the entry Install replaced. It is a no-op when not installed.
func (p *ExecutorPatch) Uninstall() {
	executorsMu.Lock()
	defer executorsMu.Unlock()
	if !p.installed {
		return
	}
	simplegoExecutors[p.OpType] = p.replaced
	simplegoExecutorPriorities[p.OpType] = p.replacedPriority
	p.installed = false
}

// Installed reports whether the patch is in simplego's table.
func (p *ExecutorPatch) Installed() bool {
	executorsMu.Lock()
	defer executorsMu.Unlock()
	return p.installed
}

// CurrentExecutor returns simplego's executor for opType now, and its priority (for tests).
func CurrentExecutor(opType backends.OpType) (Executor, int) {
	executorsMu.Lock()
	defer executorsMu.Unlock()
	return simplegoExecutors[opType], simplegoExecutorPriorities[opType]
}

// NodeData returns simplego.Node's data field: the op's parameters, as simplego's builder (or NewNode)
// stored them.
func NodeData(node *simplego.Node) any {
	if CheckSimplegoLayout() != nil {
		return nil
	}
	return *(*any)(unsafe.Add(unsafe.Pointer(node), nodeDataOffset))
}

// NodeShape returns the shape of the node's output (simplego.Node's shape field), and false when the
// internals changed.
func NodeShape(node *simplego.Node) (shapes.Shape, bool) {
	if CheckSimplegoLayout() != nil {
		return shapes.Shape{}, false
	}
	return *(*shapes.Shape)(unsafe.Add(unsafe.Pointer(node), nodeShapeOffset)), true
}

// NodeInputs returns the node's inputs: the nodes whose results it reads, in order. The slice is the
// node's own: callers must not modify it.
func NodeInputs(node *simplego.Node) []*simplego.Node {
	if CheckSimplegoLayout() != nil {
		return nil
	}
	return *(*[]*simplego.Node)(unsafe.Add(unsafe.Pointer(node), nodeInputsOffset))
}

// NodeOpType returns the node's op type, and false when the internals changed.
func NodeOpType(node *simplego.Node) (backends.OpType, bool) {
	if CheckSimplegoLayout() != nil {
		return backends.OpTypeInvalid, false
	}
	return *(*backends.OpType)(unsafe.Add(unsafe.Pointer(node), nodeOpTypeOffset)), true
}

// NodeHasMultipleOutputs reports whether the node is one of simplego's multi-output nodes, whose results
// are read through selection nodes.
func NodeHasMultipleOutputs(node *simplego.Node) bool {
	if CheckSimplegoLayout() != nil {
		return true
	}
	return len(*(*[]shapes.Shape)(unsafe.Add(unsafe.Pointer(node), nodeMultiOutputOffset))) > 0
}

// Rewrite replaces a node's op type, inputs and parameters, keeping its shape and its place in the graph:
// a compiler pass's rewriting of a node that has not been compiled yet. The executor installed for opType
// must understand data (see ExecutorPatch). Every input must come before node in its builder, as simplego
// executes nodes in the order they were built.
func Rewrite(node *simplego.Node, opType backends.OpType, inputs []*simplego.Node, data any) error {
	if err := CheckSimplegoLayout(); err != nil {
		return err
	}
	*(*backends.OpType)(unsafe.Add(unsafe.Pointer(node), nodeOpTypeOffset)) = opType
	*(*[]*simplego.Node)(unsafe.Add(unsafe.Pointer(node), nodeInputsOffset)) = inputs
	*(*any)(unsafe.Add(unsafe.Pointer(node), nodeDataOffset)) = data
	return nil
}

// NewNode adds a node of opType with the given output shape and inputs to builder, holding data as its
// parameters, for an executor installed with ExecutorPatch to read back with NodeData. The inputs must be
// ops of the same builder.
func NewNode(builder backends.Builder, opType backends.OpType, shape shapes.Shape, data any,
	inputs ...backends.Op) (backends.Op, error) {
	if err := CheckSimplegoLayout(); err != nil {
		return nil, err
	}
	b, ok := builder.(*simplego.Builder)
	if !ok {
		return nil, fmt.Errorf("%s: builder is a %T, not the pure-Go backend's", opType, builder)
	}
	nodes := make([]*simplego.Node, len(inputs))
	for i, input := range inputs {
		if nodes[i], ok = input.(*simplego.Node); !ok || nodes[i] == nil {
			return nil, fmt.Errorf("%s: input #%d is a %T, not an op of the pure-Go backend", opType, i, input)
		}
	}
	node := simplegoNewNode(b, opType, shape, nodes...)
	*(*any)(unsafe.Add(unsafe.Pointer(node), nodeDataOffset)) = data
	return node, nil
}

// DataMirror reads a simplego node's parameters through T, a Go struct that mirrors the leading fields of
// simplego's unexported parameter struct TypeName (stored by pointer in Node.data). The first read of each
// dynamic type checks names, types and offsets of T's fields against the real struct; a mismatch makes Of
// return nil (callers fall back to simplego's own executor) and is kept in Err.
type DataMirror[T any] struct {
	TypeName string

	checked atomic.Value // reflect.Type accepted last
	err     atomic.Pointer[error]
}

// Of returns node's parameters as *T, or nil when Node.data is not the mirrored struct.
func (m *DataMirror[T]) Of(node *simplego.Node) *T {
	data := NodeData(node)
	dataType := reflect.TypeOf(data)
	if checked, _ := m.checked.Load().(reflect.Type); checked != dataType {
		if err := m.check(dataType); err != nil {
			m.err.CompareAndSwap(nil, &err)
			return nil
		}
		m.checked.Store(dataType)
	}
	return (*T)(reflect.ValueOf(data).UnsafePointer())
}

// Err returns the first mismatch Of found, or nil.
func (m *DataMirror[T]) Err() error {
	if err := m.err.Load(); err != nil {
		return *err
	}
	return nil
}

func (m *DataMirror[T]) check(dataType reflect.Type) error {
	if dataType == nil || dataType.Kind() != reflect.Pointer || dataType.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("node data is %v, expected a pointer to simplego's %s (GoMLX internals changed; "+
			"written against GoMLX v0.26.0)", dataType, m.TypeName)
	}
	structType := dataType.Elem()
	simplegoPath := reflect.TypeFor[simplego.Node]().PkgPath()
	if structType.PkgPath() != simplegoPath || structType.Name() != m.TypeName {
		return fmt.Errorf("node data is %s.%s, expected %s.%s (GoMLX internals changed; written against GoMLX "+
			"v0.26.0)", structType.PkgPath(), structType.Name(), simplegoPath, m.TypeName)
	}
	mirror := reflect.TypeFor[T]()
	for i := range mirror.NumField() {
		want := mirror.Field(i)
		got, found := structType.FieldByName(want.Name)
		if !found || got.Type != want.Type || got.Offset != want.Offset {
			return fmt.Errorf("simplego's %s.%s is not a %s at offset %d (GoMLX internals changed; written "+
				"against GoMLX v0.26.0)", m.TypeName, want.Name, want.Type, want.Offset)
		}
	}
	return nil
}

// InstallReplacing installs every patch, each of which must replace an executor simplego has (the
// fallback for what the new executor does not handle), and hands each replaced executor to keep. On any
// failure it uninstalls them all, leaving simplego's table as it was, and returns the error. Like
// ExecutorPatch.Install it is idempotent: a patch already installed is left alone and keep is not called
// for it, since its executor may be reading what keep stored, on another goroutine, at that moment.
func InstallReplacing(patches []*ExecutorPatch, keep func(opType backends.OpType, replaced Executor)) error {
	for _, patch := range patches {
		if patch.Installed() {
			continue
		}
		replaced, err := patch.Install()
		if err == nil && replaced == nil {
			err = fmt.Errorf("simplego has no %s executor to fall back on", patch.OpType)
		}
		if err != nil {
			UninstallAll(patches)
			return err
		}
		keep(patch.OpType, replaced)
	}
	return nil
}

// UninstallAll restores the entries the patches replaced.
func UninstallAll(patches []*ExecutorPatch) {
	for _, patch := range patches {
		patch.Uninstall()
	}
}

var (
	// nodeIndexOffset and nodeBuilderOffset are simplego.Node's `builderIdx int` and `builder *Builder`,
	// builderNodesOffset simplego.Builder's `nodes []*Node`: the order in which simplego's sequential
	// executor runs a graph, which ScheduleFirst rewrites.
	nodeIndexOffset, nodeBuilderOffset, builderNodesOffset uintptr
	orderOnce                                              sync.Once
	orderErr                                               error
)

func checkOrderLayout() error {
	orderOnce.Do(func() {
		if orderErr = CheckSimplegoLayout(); orderErr != nil {
			return
		}
		for _, f := range []struct {
			owner  reflect.Type
			name   string
			typ    reflect.Type
			offset *uintptr
		}{
			{reflect.TypeFor[simplego.Node](), "builderIdx", reflect.TypeFor[int](), &nodeIndexOffset},
			{reflect.TypeFor[simplego.Node](), "builder", reflect.TypeFor[*simplego.Builder](), &nodeBuilderOffset},
			{reflect.TypeFor[simplego.Builder](), "nodes", reflect.TypeFor[[]*simplego.Node](), &builderNodesOffset},
		} {
			field, found := f.owner.FieldByName(f.name)
			if !found || field.Type != f.typ {
				orderErr = fmt.Errorf("simplego.%s has no field %q of type %s (GoMLX internals changed; written "+
					"against GoMLX v0.26.0)", f.owner.Name(), f.name, f.typ)
				return
			}
			*f.offset = field.Offset
		}
	})
	return orderErr
}

// ScheduleFirst reorders the builder of first's nodes, before it compiles, so that simplego's sequential
// executor (which runs nodes in the order they were built) runs each of first's nodes as early as its
// inputs allow: first[0] and the nodes it depends on, in their built order, then first[1] and what it still
// needs, and so on, then every other node in its built order. Each node still comes after its inputs. The
// parallel executor, which follows dependencies, is not affected. It reports whether the order changed.
func ScheduleFirst(first []*simplego.Node) (bool, error) {
	if len(first) == 0 {
		return false, nil
	}
	if err := checkOrderLayout(); err != nil {
		return false, err
	}
	builder := *(**simplego.Builder)(unsafe.Add(unsafe.Pointer(first[0]), nodeBuilderOffset))
	nodesPtr := (*[]*simplego.Node)(unsafe.Add(unsafe.Pointer(builder), builderNodesOffset))
	nodes := *nodesPtr
	index := func(n *simplego.Node) *int { return (*int)(unsafe.Add(unsafe.Pointer(n), nodeIndexOffset)) }
	for _, n := range first {
		if *(**simplego.Builder)(unsafe.Add(unsafe.Pointer(n), nodeBuilderOffset)) != builder {
			return false, fmt.Errorf("ScheduleFirst: nodes of different graphs")
		}
		if i := *index(n); i < 0 || i >= len(nodes) || nodes[i] != n {
			return false, fmt.Errorf("ScheduleFirst: node not at its index in its graph (GoMLX internals changed?)")
		}
	}
	placed := make([]bool, len(nodes))
	order := make([]*simplego.Node, 0, len(nodes))
	for _, target := range first {
		// The not yet placed ancestors of target (target included), placed in built order: the built order
		// is a topological order, so its restriction to any set of nodes is one too.
		var marked []int
		stack := []*simplego.Node{target}
		seen := map[int]bool{}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			i := *index(n)
			if placed[i] || seen[i] {
				continue
			}
			seen[i] = true
			marked = append(marked, i)
			stack = append(stack, NodeInputs(n)...)
		}
		slices.Sort(marked)
		for _, i := range marked {
			placed[i] = true
			order = append(order, nodes[i])
		}
	}
	for i, n := range nodes {
		if !placed[i] {
			order = append(order, n)
		}
	}
	changed := false
	for i, n := range order {
		if nodes[i] != n {
			changed = true
		}
		*index(n) = i
	}
	*nodesPtr = order
	return changed, nil
}

// Unwrap finds the T under v: v itself, or what goaccel's wrappers hold in their embedded field named
// field (each wrapper of a backend embeds the backend it wraps as Backend, each builder wrapper the builder
// as Builder), followed down as far as it goes.
func Unwrap[T any](v any, field string) (T, bool) {
	for v != nil {
		if t, ok := v.(T); ok {
			return t, true
		}
		value := reflect.ValueOf(v)
		if value.Kind() == reflect.Pointer && !value.IsNil() {
			value = value.Elem()
		}
		if value.Kind() != reflect.Struct {
			break
		}
		inner := value.FieldByName(field)
		if !inner.IsValid() || !inner.CanInterface() || inner.Kind() != reflect.Interface {
			break
		}
		v = inner.Interface()
	}
	var zero T
	return zero, false
}
