package indexing

import (
	"slices"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// rowMove is a gather or scatter that moves whole rows of a table shaped [tableRows, row axes...]:
// index i of count picks table row indices[i], a block of rowSize elements.
type rowMove struct {
	tableRows, rowSize, count int
}

// singleIndices returns the batch axes' dimensions of an indices tensor whose index vectors each hold one
// index (into the table's first axis), and false when they hold more.
func singleIndices(indices shapes.Shape, indexVectorAxis int) ([]int, bool) {
	dims := indices.Dimensions
	switch {
	case indexVectorAxis == len(dims): // XLA's implicit trailing index vector of one
		return dims, true
	case indexVectorAxis == len(dims)-1 && dims[indexVectorAxis] == 1:
		return dims[:indexVectorAxis], true
	}
	return nil, false
}

// trailing reports whether axes are first, first+1, …, first+n−1.
func trailing(axes []int, first, n int) bool {
	if len(axes) != n {
		return false
	}
	for i, axis := range axes {
		if axis != first+i {
			return false
		}
	}
	return true
}

// rowsLayout checks what gathers and scatters of rows share: index vectors of one index into the table's
// first axis, the row's axes after the batch axes in the other operand (rows: gathered output or scattered
// updates) with the table's row dimensions, the same dtype.
func rowsLayout(table, indices, rows shapes.Shape, indexVectorAxis int, rowAxes []int) (rowMove, bool) {
	rank := table.Rank()
	if rank < 1 || table.Dimensions[0] < 1 || rows.DType != table.DType {
		return rowMove{}, false
	}
	batch, ok := singleIndices(indices, indexVectorAxis)
	if !ok || !trailing(rowAxes, len(batch), rank-1) ||
		!slices.Equal(rows.Dimensions, slices.Concat(batch, table.Dimensions[1:])) {
		return rowMove{}, false
	}
	rowSize, count := 1, 1
	for _, d := range table.Dimensions[1:] {
		rowSize *= d
	}
	for _, d := range batch {
		count *= d
	}
	return rowMove{tableRows: table.Dimensions[0], rowSize: rowSize, count: count}, true
}

// gatherLayout recognizes a Gather of whole rows: one start index into the table's first axis, which the
// slice collapses, and the rest of every row taken.
func gatherLayout(data any, table, indices, output shapes.Shape) (rowMove, bool) {
	r, err := gomlxpatch.NewNodeDataReader(data, "gatherNode")
	if err != nil {
		return rowMove{}, false
	}
	indexVectorAxis := r.Int("indexVectorAxis")
	offsetAxes, collapsed := r.Ints("offsetOutputAxes"), r.Ints("collapsedSlicesAxes")
	startIndexMap, sliceSizes := r.Ints("startIndexMap"), r.Ints("sliceSizes")
	if r.Err != nil || !slices.Equal(startIndexMap, []int{0}) || !slices.Equal(collapsed, []int{0}) ||
		len(sliceSizes) != table.Rank() || sliceSizes[0] != 1 || !slices.Equal(sliceSizes[1:], table.Dimensions[1:]) {
		return rowMove{}, false
	}
	return rowsLayout(table, indices, output, indexVectorAxis, offsetAxes)
}

// scatterLayout recognizes a scatter of whole rows: one index into the table's first axis, which the
// update windows leave out, and each window a whole row.
func scatterLayout(data any, table, indices, updates, output shapes.Shape) (rowMove, bool) {
	r, err := gomlxpatch.NewNodeDataReader(data, "scatterNode")
	if err != nil {
		return rowMove{}, false
	}
	indexVectorAxis := r.Int("indexVectorAxis")
	windowAxes, inserted := r.Ints("updateWindowAxes"), r.Ints("insertedWindowAxes")
	toOperand := r.Ints("scatterAxesToOperandAxes")
	if r.Err != nil || !slices.Equal(inserted, []int{0}) || !slices.Equal(toOperand, []int{0}) || !output.Equal(table) {
		return rowMove{}, false
	}
	return rowsLayout(table, indices, updates, indexVectorAxis, windowAxes)
}

// tableRows converts indices (int32, int64 or int) to table rows: clamped into [0, tableRows) for a gather,
// −1 where out of range for a scatter. False for other index types.
func tableRows(indices any, tableRows int, clamp bool) ([]int, bool) {
	switch idx := indices.(type) {
	case []int32:
		return rowsOf(idx, tableRows, clamp), true
	case []int64:
		return rowsOf(idx, tableRows, clamp), true
	case []int:
		return rowsOf(idx, tableRows, clamp), true
	}
	return nil, false
}

func rowsOf[I int32 | int64 | int](indices []I, tableRows int, clamp bool) []int {
	rows := make([]int, len(indices))
	for i, index := range indices {
		row := int(index)
		switch {
		case clamp:
			row = min(max(row, 0), tableRows-1)
		case row < 0 || row >= tableRows:
			row = -1
		}
		rows[i] = row
	}
	return rows
}

// gatherRows computes a Gather of whole rows, or returns false (allocating nothing) for any other.
func gatherRows(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (*simplego.Buffer, bool) {
	outShape, ok := gomlxpatch.NodeShape(node)
	in, ok2 := shapesOf(backend, inputs)
	if !ok || !ok2 || len(in) != 2 {
		return nil, false
	}
	move, ok := gatherLayout(gomlxpatch.NodeData(node), in[0], in[1], outShape)
	if !ok {
		return nil, false
	}
	table, err1 := backend.BufferData(inputs[0])
	indices, err2 := backend.BufferData(inputs[1])
	if err1 != nil || err2 != nil || !copyable(table) {
		return nil, false
	}
	rows, ok := tableRows(indices, move.tableRows, true)
	if !ok {
		return nil, false
	}
	output, outData, ok := newOutput(backend, outShape)
	if !ok {
		return nil, false
	}
	for i := range rows { // the rows, clamped into the table, become the offsets of the runs to copy
		rows[i] *= move.rowSize
	}
	copyRuns(outData, table, rows, move.rowSize)
	return output, true
}

// scatterRows computes a ScatterSum of whole rows, or returns false (allocating and consuming nothing) for
// any other.
func scatterRows(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, bool) {
	outShape, ok := gomlxpatch.NodeShape(node)
	in, ok2 := shapesOf(backend, inputs)
	if !ok || !ok2 || len(in) != 3 {
		return nil, false
	}
	move, ok := scatterLayout(gomlxpatch.NodeData(node), in[0], in[1], in[2], outShape)
	if !ok {
		return nil, false
	}
	table, err1 := backend.BufferData(inputs[0])
	indices, err2 := backend.BufferData(inputs[1])
	updates, err3 := backend.BufferData(inputs[2])
	if err1 != nil || err2 != nil || err3 != nil || !addable(table) {
		return nil, false
	}
	rows, ok := tableRows(indices, move.tableRows, false)
	if !ok {
		return nil, false
	}
	// The sum starts from the table: in place when the table's buffer is this node's to consume.
	output := inputs[0]
	if inputsOwned[0] {
		inputs[0] = nil // simplego's signal that the input buffer lives on as the output
	} else if output = backend.NewBuffer(outShape); output == nil {
		return nil, false
	}
	outData, err := backend.BufferData(output)
	if err != nil {
		return nil, false
	}
	addRows(outData, table, updates, rows, move.rowSize)
	return output, true
}

// copyable reports whether copyRuns handles the data's type.
func copyable(data any) bool {
	switch data.(type) {
	case []float32, []float64, []int32, []int64, []uint8, []bool:
		return true
	}
	return false
}

// addable reports whether addRows handles the data's type.
func addable(data any) bool {
	switch data.(type) {
	case []float32, []float64, []int32, []int64:
		return true
	}
	return false
}

// addRows sets dst to table (unless dst is table's own memory) and adds updates' i-th row to its row
// rows[i], for each i in order, skipping rows of −1.
func addRows(dst, table, updates any, rows []int, rowSize int) {
	switch d := dst.(type) {
	case []float32:
		addRowsOf(d, table.([]float32), updates.([]float32), rows, rowSize)
	case []float64:
		addRowsOf(d, table.([]float64), updates.([]float64), rows, rowSize)
	case []int32:
		addRowsOf(d, table.([]int32), updates.([]int32), rows, rowSize)
	case []int64:
		addRowsOf(d, table.([]int64), updates.([]int64), rows, rowSize)
	}
}

func addRowsOf[T float32 | float64 | int32 | int64](dst, table, updates []T, rows []int, rowSize int) {
	if len(dst) > 0 && &dst[0] != &table[0] {
		copy(dst, table)
	}
	for i, row := range rows {
		if row < 0 {
			continue
		}
		out, update := dst[row*rowSize:(row+1)*rowSize], updates[i*rowSize:(i+1)*rowSize]
		for j, v := range update {
			out[j] += v
		}
	}
}
