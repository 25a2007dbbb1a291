package blas

import (
	_ "unsafe" // Required by //go:linkname.

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
)

// executor has the signature of simplego's unexported nodeExecutor type, the element type of its executor
// table. A named func type with the same signature has the same memory representation, which is what the
// linkname pull below relies on; the pin test guards the GoMLX version it was checked against.
type executor func(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error)

// simplegoExecutors is simplego's nodeExecutors table: the executor simplego calls for each op type, read
// at every node execution. There is no exported hook to replace an entry, hence the linkname.
//
//go:linkname simplegoExecutors github.com/gomlx/gomlx/backends/simplego.nodeExecutors
var simplegoExecutors [backends.OpTypeLast]executor

// simplegoExecutorPriorities is simplego's nodeExecutorsPriority table (its registerPriority has int as
// underlying type). Install raises the DotGeneral entry to priorityUser, as simplego's own setNodeExecutor
// would, so that a later registration at a lower priority does not undo the patch.
//
//go:linkname simplegoExecutorPriorities github.com/gomlx/gomlx/backends/simplego.nodeExecutorsPriority
var simplegoExecutorPriorities [backends.OpTypeLast]int

// priorityUser mirrors simplego's priorityUser, the level reserved for user overrides.
const priorityUser = 100
