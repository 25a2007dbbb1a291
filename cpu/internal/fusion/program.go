package fusion

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/broadcast"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
	"github.com/goaccel/goaccel/cpu/internal/threads"
	"github.com/goaccel/goaccel/internal/vec32"
)

// tile is the number of elements a program computes at a time: 2 KB per value, so that the values a chain
// keeps live (its registers) stay in the first-level cache together with the inputs' tiles.
const tile = 512

// program is what a fused node computes: instructions over registers of one tile each, reading the node's
// inputs (leaves).
type program struct {
	shape   shapes.Shape
	leaves  []leaf
	instrs  []instr
	numRegs int
	// describe is the chain, for errors and tests: its operations in order.
	describe string

	states sync.Pool // *runState
}

type leafKind uint8

const (
	leafFull      leafKind = iota // the output's shape: float32 read in place, booleans converted per tile
	leafScalar                    // one value
	leafBroadcast                 // spanning a run of the output's axes: expanded into a register per tile
)

// leaf is one of a fused node's inputs: float32, or booleans (held as 1 and 0 in a register).
type leaf struct {
	kind    leafKind
	isBool  bool
	pattern broadcast.Pattern // leafBroadcast
	// reg is the register of a leaf read through one (expanded broadcasts, booleans), or of a scalar
	// splatted for select; −1 for none.
	reg int
	// window: a leafFull read from a contiguous part of a larger vector, starting at offset (see
	// contiguousWindow). Its input is the whole vector, never the output.
	window bool
	offset int
}

type operandKind uint8

const (
	inReg    operandKind = iota
	inLeaf               // a leafFull, read in place
	inScalar             // a leafScalar or leafBoolScalar's value
)

type operand struct {
	kind  operandKind
	index int // register or leaf
}

type instr struct {
	kind  elementKind // binaryElement, unaryElement, selectElement, or copyElement
	op    vec32.Op
	unary vec32.Unary
	dst   int // register, or -1 for the output
	args  [3]operand
}

// copyElement copies a value to the output: the root of a chain that ends in a conversion.
const copyElement elementKind = 100

// compile turns a chain (members in order, inputs first) into a program and the chain's leaves (its
// inputs from outside, which become the rewritten root's inputs).
func compile(c *chain, elements map[*simplego.Node]element, chainOf map[*simplego.Node]*chain) (*program, []*simplego.Node) {
	p := &program{shape: shapeOf(c.root).Clone()}
	var leafNodes []*simplego.Node
	leafValues := map[*simplego.Node]operand{}
	// leafOperand returns the operand of an input from outside the chain, adding it as a leaf the first
	// time. Leaves that need a register of their own (expanded broadcasts, booleans) keep it for the whole
	// program.
	leafOperand := func(node *simplego.Node) operand {
		if v, ok := leafValues[node]; ok {
			return v
		}
		source, dims := node, shapeOf(node).Dimensions
		if vector, offset, ok := contiguousWindow(node, p.shape); ok {
			index := len(leafNodes)
			leafNodes = append(leafNodes, vector)
			p.leaves = append(p.leaves, leaf{kind: leafFull, reg: -1, window: true, offset: offset})
			v := operand{kind: inLeaf, index: index}
			leafValues[node] = v
			return v
		}
		if src, srcDims, ok := throughBroadcast(node); ok {
			if _, fits := broadcast.Of(srcDims, p.shape.Dimensions); fits {
				// The broadcast's source, read with its pattern: the broadcast itself need not run.
				source, dims = src, srcDims
			}
		}
		shape := shapeOf(source)
		index := len(leafNodes)
		leafNodes = append(leafNodes, source)
		l, v := leaf{isBool: shape.DType == dtypes.Bool, reg: -1}, operand{kind: inScalar, index: index}
		switch {
		case shape.Size() == 1:
			l.kind = leafScalar
		case slices.Equal(dims, p.shape.Dimensions) && !l.isBool:
			l.kind, v = leafFull, operand{kind: inLeaf, index: index}
		default:
			l.kind = leafFull
			if !slices.Equal(dims, p.shape.Dimensions) {
				l.kind = leafBroadcast
				l.pattern, _ = broadcast.Of(dims, p.shape.Dimensions) // classify or the check above made sure
			}
			l.reg = p.numRegs
			p.numRegs++
			v = operand{kind: inReg, index: l.reg}
		}
		p.leaves = append(p.leaves, l)
		leafValues[node] = v
		return v
	}
	// splat turns a scalar operand into a register holding it everywhere (select reads whole tiles).
	splat := func(v operand) operand {
		if v.kind != inScalar {
			return v
		}
		l := &p.leaves[v.index]
		if l.reg < 0 {
			l.reg = p.numRegs
			p.numRegs++
		}
		return operand{kind: inReg, index: l.reg}
	}

	// First the values: each member's result is a value, except a conversion's, which is its operand's
	// value (booleans are held as 1 and 0 already). Then when each value is read for the last time, so that
	// its register can take a later result.
	const leafValue = -1
	valueOf := map[*simplego.Node]int{} // member → value
	var lastRead []int                  // value → index of the last member that reads it
	argValues := make([][]int, len(c.members))
	for i, member := range c.members {
		for _, input := range gomlxpatch.NodeInputs(member) {
			v := leafValue
			if chainOf[input] == c && input != member {
				v = valueOf[input]
				lastRead[v] = i
			}
			argValues[i] = append(argValues[i], v)
		}
		if v := argValues[i][0]; elements[member].kind == convertElement && v != leafValue {
			valueOf[member] = v // the converted member's value itself
			continue
		}
		valueOf[member] = len(lastRead) // a new value (a converted leaf's is the leaf's operand)
		lastRead = append(lastRead, -1)
	}

	regOf := make([]operand, len(lastRead))
	isResult := map[int]bool{} // registers that hold member results (leaves' registers are never reused)
	var free []int
	var names []string
	for i, member := range c.members {
		e := elements[member]
		names = append(names, e.opType.String())
		var args []operand
		for j, input := range gomlxpatch.NodeInputs(member) {
			if v := argValues[i][j]; v != leafValue {
				args = append(args, regOf[v])
			} else {
				args = append(args, leafOperand(input))
			}
		}
		// Values read for the last time here give their registers back before this member's result takes
		// one: an element-wise loop may write where it reads.
		for _, v := range argValues[i] {
			if v != leafValue && lastRead[v] == i && regOf[v].kind == inReg && isResult[regOf[v].index] &&
				!slices.Contains(free, regOf[v].index) {
				free = append(free, regOf[v].index)
			}
		}
		if e.kind == convertElement {
			if member == c.root {
				p.instrs = append(p.instrs, instr{kind: copyElement, dst: -1, args: [3]operand{splat(args[0])}})
			} else if argValues[i][0] == leafValue {
				regOf[valueOf[member]] = args[0] // a converted leaf: the leaf's operand
			}
			continue
		}
		in := instr{kind: e.kind, op: e.op, unary: e.unary, dst: -1}
		// The loops read whole tiles, except a binary operation's one scalar side: every other operand that
		// is a scalar (a broadcast constant, such as a mean's gradient) is spread into a register first.
		switch {
		case e.kind == selectElement:
			args[0], args[1], args[2] = splat(args[0]), splat(args[1]), splat(args[2])
		case e.kind == unaryElement:
			args[0] = splat(args[0])
		case e.kind == binaryElement && args[0].kind == inScalar && args[1].kind == inScalar:
			args[0] = splat(args[0])
		}
		copy(in.args[:], args)
		if member != c.root {
			if len(free) > 0 {
				in.dst, free = free[len(free)-1], free[:len(free)-1]
			} else {
				in.dst = p.numRegs
				p.numRegs++
				isResult[in.dst] = true
			}
			regOf[valueOf[member]] = operand{kind: inReg, index: in.dst}
		}
		p.instrs = append(p.instrs, in)
	}
	p.describe = strings.Join(names, "→")
	return p, leafNodes
}

// runState is one execution's scratch: the registers and the leaves' data.
type runState struct {
	regs     []float32
	boolTile []bool // a broadcast boolean leaf's tile, before conversion
	floats   [][]float32
	bools    [][]bool
	scalars  []float32
}

func (p *program) state() *runState {
	if s, ok := p.states.Get().(*runState); ok {
		return s
	}
	return &runState{regs: make([]float32, p.numRegs*tile), boolTile: make([]bool, tile), floats: make([][]float32, len(p.leaves)),
		bools: make([][]bool, len(p.leaves)), scalars: make([]float32, len(p.leaves))}
}

// run computes the fused node: the output reuses a float32 input of its shape the executor owns, as
// simplego's own element-wise executors do.
func (p *program) run(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool) (*simplego.Buffer, error) {
	if len(inputs) != len(p.leaves) {
		return nil, fmt.Errorf("fusion: %s: %d inputs for a program of %d", p.describe, len(inputs), len(p.leaves))
	}
	s := p.state()
	defer p.states.Put(s)
	var output *simplego.Buffer
	for i, l := range p.leaves {
		data, err := backend.BufferData(inputs[i])
		if err != nil {
			return nil, fmt.Errorf("fusion: %s: input %d: %w", p.describe, i, err)
		}
		switch {
		case l.isBool:
			s.bools[i] = data.([]bool)
			s.scalars[i] = 0
			if s.bools[i][0] {
				s.scalars[i] = 1
			}
		default:
			s.floats[i] = data.([]float32)
			if l.window {
				s.floats[i] = s.floats[i][l.offset : l.offset+p.shape.Size()]
			}
			s.scalars[i] = s.floats[i][0]
			if l.kind == leafFull && !l.window && output == nil && inputsOwned[i] {
				output = inputs[i]
				inputs[i] = nil // simplego's signal that the input buffer lives on as the output.
			}
		}
	}
	if output == nil {
		if output = backend.NewBuffer(p.shape); output == nil {
			return nil, fmt.Errorf("fusion: %s: the backend could not allocate the output %s", p.describe, p.shape)
		}
	}
	outData, err := backend.BufferData(output)
	if err != nil {
		return nil, fmt.Errorf("fusion: %s: output: %w", p.describe, err)
	}
	out := outData.([]float32)
	p.fillScalars(s)
	size := p.shape.Size()
	tiles := (size + tile - 1) / tile
	workers := min(threads.Budget(), tiles)
	if size < parallelElements {
		workers = 1
	}
	runTiles := func(s *runState, first, end int) {
		for t := first; t < end; t++ {
			p.runTile(s, out, t*tile, min((t+1)*tile, size))
		}
	}
	if workers > 1 {
		// Each worker computes whole tiles in its own registers; the inputs are read, never written.
		threads.Split(workers, func(w int) {
			if w == 0 {
				runTiles(s, 0, tiles/workers)
				return
			}
			ws := p.state()
			copy(ws.floats, s.floats)
			copy(ws.bools, s.bools)
			copy(ws.scalars, s.scalars)
			p.fillScalars(ws)
			runTiles(ws, tiles*w/workers, tiles*(w+1)/workers)
			clear(ws.floats)
			clear(ws.bools)
			p.states.Put(ws)
		})
	} else {
		runTiles(s, 0, tiles)
	}
	clear(s.floats)
	clear(s.bools)
	return output, nil
}

// parallelElements is the output size from which a program's tiles are split over the compute threads
// (threads.Split): below it the hand-over to a worker costs more than the split saves.
const parallelElements = 1 << 14

// fillScalars sets the registers of the program's scalar leaves to their values, a tile long.
func (p *program) fillScalars(s *runState) {
	for i, l := range p.leaves {
		if l.kind == leafScalar && l.reg >= 0 {
			reg := s.regs[l.reg*tile : (l.reg+1)*tile]
			for j := range reg {
				reg[j] = s.scalars[i]
			}
		}
	}
}

// runTile computes output elements [lo, hi).
func (p *program) runTile(s *runState, out []float32, lo, hi int) {
	n := hi - lo
	reg := func(r int) []float32 { return s.regs[r*tile : r*tile+n] }
	for i, l := range p.leaves {
		switch {
		case l.kind == leafScalar || (l.kind == leafFull && !l.isBool):
		case !l.isBool:
			broadcast.Expand(l.pattern, reg(l.reg), s.floats[i], lo)
		case l.kind == leafFull:
			vec32.FromBool(reg(l.reg), s.bools[i][lo:hi])
		default:
			expanded := s.boolTile[:n]
			broadcast.Expand(l.pattern, expanded, s.bools[i], lo)
			vec32.FromBool(reg(l.reg), expanded)
		}
	}
	slice := func(a operand) []float32 {
		if a.kind == inLeaf {
			return s.floats[a.index][lo:hi]
		}
		return reg(a.index)
	}
	for _, in := range p.instrs {
		var dst []float32
		if in.dst < 0 {
			dst = out[lo:hi]
		} else {
			dst = reg(in.dst)
		}
		switch in.kind {
		case binaryElement:
			a, b := in.args[0], in.args[1]
			switch {
			case b.kind == inScalar:
				vec32.BinaryScalar(in.op, dst, slice(a), s.scalars[b.index])
			case a.kind == inScalar:
				vec32.ScalarBinary(in.op, dst, s.scalars[a.index], slice(b))
			default:
				vec32.Binary(in.op, dst, slice(a), slice(b))
			}
		case unaryElement:
			vec32.Apply(in.unary, dst, slice(in.args[0]))
		case selectElement:
			vec32.Select(dst, slice(in.args[0]), slice(in.args[1]), slice(in.args[2]))
		case copyElement:
			copy(dst, slice(in.args[0]))
		}
	}
}

// contiguousWindow recognises a float32 leaf of the program's shape that is a stride-1 Slice of a vector,
// possibly reshaped: every update of a prepared model slices its flat gradient buckets back into one
// gradient per parameter (bucketgraph.Unflatten). The program then reads the gradient inside the bucket,
// and the Slice, which copies it, need not run. It returns the vector and the window's first element.
func contiguousWindow(node *simplego.Node, shape shapes.Shape) (vector *simplego.Node, offset int, ok bool) {
	if s := shapeOf(node); s.DType != dtypes.Float32 || !slices.Equal(s.Dimensions, shape.Dimensions) {
		return nil, 0, false
	}
	slice := throughReshapes(node)
	in, ok := is(slice, backends.OpTypeSlice, 1)
	if !ok || shapeOf(in[0]).Rank() != 1 || shapeOf(in[0]).DType != dtypes.Float32 {
		return nil, 0, false
	}
	r, err := gomlxpatch.NewNodeDataReader(gomlxpatch.NodeData(slice), "sliceNode")
	if err != nil {
		return nil, 0, false
	}
	starts, strides := r.Ints("starts"), r.Ints("strides")
	if r.Err != nil || len(starts) != 1 || len(strides) != 1 || (strides[0] != 1 && shape.Size() > 1) {
		return nil, 0, false
	}
	if starts[0] < 0 || starts[0]+shape.Size() > shapeOf(in[0]).Size() {
		return nil, 0, false
	}
	return in[0], starts[0], true
}
