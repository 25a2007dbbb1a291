// Package backends holds what goaccel needs to know about the processes of a job: the topology read from the
// launcher and the collective engine that moves bytes between processes. It links no compute backend (GoMLX
// backend selection lives in package backends/compute), so engines and launch tooling stay light.
//
// Collective engines follow the database/sql driver pattern: an engine implements the small [Engine]
// interface and registers a constructor by name with [RegisterEngine]; users and the rest of goaccel only see
// [Communicator], which wraps any engine with the counters, the watchdog and the error handling that every
// engine would otherwise have to repeat.
//
// Engines shipped with goaccel:
//
//   - "single": world size 1, every collective is a local no-op.
//   - "inprocess": N goroutine ranks sharing memory ([NewInProcessGroup]); for tests and one host with
//     several devices driven from one process.
//   - "mpi": the MPI C API through cgo (package backends/mpi, build tag `mpi`), the engine for more than one
//     process.
package backends

import (
	"fmt"
	"sort"
	"sync"
	"unsafe"
)

// Request is an operation in flight on an engine.
type Request interface {
	// Test reports whether the operation completed, without blocking. Engines make progress inside Test, so
	// callers poll it rather than blocking in the engine: that is what lets the Communicator's watchdog
	// bound every wait.
	Test() (done bool, err error)
}

// Engine is the driver interface of a collective engine. All operations are collective: every rank must
// call them in the same order with buffers of the same length and element type. Buffers are Go slices of
// one of the element types [Elements] accepts; they must stay untouched until the request completes.
//
// Engines need not be safe for concurrent use: the Communicator serialises calls.
type Engine interface {
	Rank() int
	Size() int
	// StartAllReduceSum starts an in-place element-wise sum of buf across all ranks.
	StartAllReduceSum(buf any) (Request, error)
	// StartBroadcast starts copying root's buf into every other rank's buf.
	StartBroadcast(buf any, root int) (Request, error)
	// StartAllGather starts gathering every rank's send (all of equal length) into recv, ordered by rank:
	// len(recv) == Size()*len(send).
	StartAllGather(send, recv any) (Request, error)
	// StartBarrier starts a barrier: it completes once every rank started it.
	StartBarrier() (Request, error)
	// Abort ends every rank of the job as promptly as the engine can, with the given exit code. It is used
	// when one rank cannot continue and the others would otherwise wait forever.
	Abort(code int)
	// Close releases the engine; no collective may follow.
	Close() error
}

// EngineFactory opens an engine for the given topology.
type EngineFactory func(topo Topology) (Engine, error)

var (
	enginesMu sync.RWMutex
	engines   = map[string]EngineFactory{}
)

// RegisterEngine makes a collective engine available by name. It panics if the name is taken or the factory
// is nil, as database/sql does for drivers: both are programming errors that must surface at start-up, not
// when a job first opens the engine.
func RegisterEngine(name string, factory EngineFactory) {
	if factory == nil {
		panic(fmt.Sprintf("backends: engine %q registered with a nil factory", name))
	}
	enginesMu.Lock()
	defer enginesMu.Unlock()
	if _, dup := engines[name]; dup {
		panic(fmt.Sprintf("backends: engine %q registered twice", name))
	}
	engines[name] = factory
}

// Engines lists the registered engine names, sorted.
func Engines() []string {
	enginesMu.RLock()
	defer enginesMu.RUnlock()
	names := make([]string, 0, len(engines))
	for name := range engines {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// EngineRegistered reports whether an engine of that name was registered (linked into this binary).
func EngineRegistered(name string) bool {
	enginesMu.RLock()
	defer enginesMu.RUnlock()
	_, ok := engines[name]
	return ok
}

// OpenEngine opens the named engine for the topology.
func OpenEngine(name string, topo Topology) (Engine, error) {
	enginesMu.RLock()
	factory, ok := engines[name]
	enginesMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("backends: collective engine %q is not registered in this binary (registered: %v)",
			name, Engines())
	}
	return factory(topo)
}

// ElementKind names the element types collectives accept.
type ElementKind int

// Element kinds; the names match MPI's and GoMLX's dtypes.
const (
	Float32 ElementKind = iota
	Float64
	Int32
	Int64
	Uint8
)

var elementKindNames = [...]string{"float32", "float64", "int32", "int64", "uint8"}

func (k ElementKind) String() string {
	if int(k) < len(elementKindNames) {
		return elementKindNames[k]
	}
	return fmt.Sprintf("ElementKind(%d)", int(k))
}

// BufferInfo describes a collective buffer: its element kind, length, size in bytes and the address of its
// first element (nil for an empty buffer). Engines written in cgo hand Ptr to C.
type BufferInfo struct {
	Kind  ElementKind
	Len   int
	Bytes int
	Ptr   unsafe.Pointer
}

// Elements describes buf, which must be a []float32, []float64, []int32, []int64 or []byte.
func Elements(buf any) (BufferInfo, error) {
	switch b := buf.(type) {
	case []float32:
		return info(Float32, b), nil
	case []float64:
		return info(Float64, b), nil
	case []int32:
		return info(Int32, b), nil
	case []int64:
		return info(Int64, b), nil
	case []byte:
		return info(Uint8, b), nil
	default:
		return BufferInfo{}, fmt.Errorf("backends: collective buffers must be []float32, []float64, []int32, "+
			"[]int64 or []byte, got %T", buf)
	}
}

func info[T any](kind ElementKind, b []T) BufferInfo {
	bi := BufferInfo{Kind: kind, Len: len(b)}
	if len(b) > 0 {
		var zero T
		bi.Bytes = len(b) * int(unsafe.Sizeof(zero))
		bi.Ptr = unsafe.Pointer(&b[0])
	}
	return bi
}

// sumInto adds src into dst element-wise; both must be slices of the same kind and length. Engines that
// reduce in Go (single, in-process) share it.
func sumInto(dst, src any) error {
	switch d := dst.(type) {
	case []float32:
		return addSlices(d, src)
	case []float64:
		return addSlices(d, src)
	case []int32:
		return addSlices(d, src)
	case []int64:
		return addSlices(d, src)
	case []byte:
		return addSlices(d, src)
	}
	return fmt.Errorf("backends: cannot sum %T", dst)
}

func addSlices[T float32 | float64 | int32 | int64 | byte](dst []T, srcAny any) error {
	src, ok := srcAny.([]T)
	if !ok || len(src) != len(dst) {
		return fmt.Errorf("backends: mismatched collective buffers %T[%d] and %T", dst, len(dst), srcAny)
	}
	for i, v := range src {
		dst[i] += v
	}
	return nil
}

// copyInto copies src into dst (same kind, same length).
func copyInto(dst, src any) error {
	di, err := Elements(dst)
	if err != nil {
		return err
	}
	si, err := Elements(src)
	if err != nil {
		return err
	}
	if di.Kind != si.Kind || di.Len != si.Len {
		return fmt.Errorf("backends: mismatched collective buffers %s[%d] and %s[%d]", di.Kind, di.Len, si.Kind, si.Len)
	}
	if di.Bytes > 0 {
		copy(unsafe.Slice((*byte)(di.Ptr), di.Bytes), unsafe.Slice((*byte)(si.Ptr), si.Bytes))
	}
	return nil
}

// doneRequest is a request that completed when it was started.
type doneRequest struct{ err error }

func (r doneRequest) Test() (bool, error) { return true, r.err }
