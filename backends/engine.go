// Package backends holds what goaccel needs to know about the processes of a job: the topology read from the
// launcher and the collective engine that moves bytes between processes. It links no compute backend (GoMLX
// backend selection lives in package cpu), so engines and launch tooling stay light.
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

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/x448/float16"

	"github.com/goaccel/goaccel/internal/half"
)

// Request is an operation in flight on an engine.
type Request interface {
	// Test reports whether the operation completed, without blocking. Engines make progress inside Test, so
	// callers poll it rather than blocking in the engine: that is what lets the Communicator's watchdog
	// bound every wait.
	Test() (done bool, err error)
}

// Engine is the driver interface of a collective engine. All operations are collective: every rank must
// call them in the same order with buffers of the same length and element kind. Buffers arrive classified
// (a [Buffer]: element kind, length, address), so an engine never inspects Go types; they must stay
// untouched until the request completes.
//
// Engines need not be safe for concurrent use: the Communicator serialises calls.
type Engine interface {
	Rank() int
	Size() int
	// StartAllReduceSum starts an in-place element-wise sum of buf across all ranks.
	StartAllReduceSum(buf Buffer) (Request, error)
	// StartReduceScatterSum starts an element-wise sum of every rank's send across all ranks that leaves
	// block r of the sum in rank r's recv: send.Len == Size()*recv.Len, and the blocks are send's
	// consecutive recv.Len-element parts. It is the first half of a sharded (ZeRO-style) gradient sync.
	StartReduceScatterSum(send, recv Buffer) (Request, error)
	// StartBroadcast starts copying root's buf into every other rank's buf.
	StartBroadcast(buf Buffer, root int) (Request, error)
	// StartAllGather starts gathering every rank's send (all of equal length) into recv, ordered by rank:
	// recv.Len == Size()*send.Len.
	StartAllGather(send, recv Buffer) (Request, error)
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
//
// BFloat16 and Float16 are the 16-bit formats compressed gradients travel in (Go types
// bfloat16.BFloat16 from GoMLX and float16.Float16 from github.com/x448/float16, GoMLX's own). Their sum
// is computed in float32: every engine converts each pair of values to float32, adds them there and rounds
// the sum to the 16-bit format (to nearest, ties to even). A reduction over N ranks adds N-1 times, so an
// element carries up to N-1 roundings of partial sums (see docs/semantics.md section 10).
const (
	Float32 ElementKind = iota
	Float64
	Int32
	Int64
	Uint8
	BFloat16
	Float16
)

var elementKindNames = [...]string{"float32", "float64", "int32", "int64", "uint8", "bfloat16", "float16"}

func (k ElementKind) String() string {
	// Safe on any value: a peer's call record may hold anything (a rank out of step, a corrupted message).
	if k >= 0 && int(k) < len(elementKindNames) {
		return elementKindNames[k]
	}
	return fmt.Sprintf("ElementKind(%d)", int(k))
}

// Buffer is a collective buffer, classified once: its element kind, length, size in bytes and the address
// of its first element (nil for an empty buffer). Engines get every buffer in this form; engines written in
// cgo hand Ptr to C, engines written in Go view it with [View]. A Buffer made from a Go slice keeps that
// slice's array alive (Ptr is a pointer the garbage collector follows).
type Buffer struct {
	Kind  ElementKind
	Len   int
	Bytes int
	Ptr   unsafe.Pointer
}

// Element is the set of Go element types collectives accept.
type Element interface {
	float32 | float64 | int32 | int64 | uint8 | bfloat16.BFloat16 | float16.Float16
}

// KindOf is the element kind of T.
func KindOf[T Element]() ElementKind {
	var zero T
	switch any(zero).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case int32:
		return Int32
	case int64:
		return Int64
	case bfloat16.BFloat16:
		return BFloat16
	case float16.Float16:
		return Float16
	}
	return Uint8
}

// BufferOf classifies a slice without a type switch.
func BufferOf[T Element](s []T) Buffer {
	b := Buffer{Kind: KindOf[T](), Len: len(s)}
	if len(s) > 0 {
		b.Bytes = len(s) * int(unsafe.Sizeof(s[0]))
		b.Ptr = unsafe.Pointer(&s[0])
	}
	return b
}

// View returns b's elements as a []T, sharing its memory. It panics when T is not b's element kind: a
// programming error in an engine, never a user's.
func View[T Element](b Buffer) []T {
	if k := KindOf[T](); k != b.Kind {
		panic(fmt.Sprintf("backends: viewing a %s buffer as %s", b.Kind, k))
	}
	if b.Len == 0 {
		return nil
	}
	return unsafe.Slice((*T)(b.Ptr), b.Len)
}

// Slice returns the elements [from, to) of b, sharing its memory.
func (b Buffer) Slice(from, to int) Buffer {
	if from < 0 || to < from || to > b.Len {
		panic(fmt.Sprintf("backends: slice [%d:%d] of a buffer of %d elements", from, to, b.Len))
	}
	size := b.Kind.Size()
	s := Buffer{Kind: b.Kind, Len: to - from, Bytes: (to - from) * size}
	if s.Len > 0 {
		s.Ptr = unsafe.Add(b.Ptr, from*size)
	}
	return s
}

// bytes views the buffer's memory.
func (b Buffer) bytes() []byte {
	if b.Bytes == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(b.Ptr), b.Bytes)
}

// Size is the size of one element in bytes.
func (k ElementKind) Size() int {
	switch k {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	case BFloat16, Float16:
		return 2
	}
	return 1
}

// check refuses a Buffer that BufferOf (or Slice) cannot have made: a collective would read or write
// memory outside it.
func (b Buffer) check() error {
	if b.Kind < Float32 || b.Kind > Float16 || b.Len < 0 || b.Bytes != b.Len*b.Kind.Size() || (b.Len > 0) != (b.Ptr != nil) {
		return fmt.Errorf("backends: malformed buffer %+v", b)
	}
	return nil
}

// Elements classifies the flat data of a tensor (GoMLX's FlatData), which must be a []float32, []float64,
// []int32, []int64, []byte, []bfloat16.BFloat16 or []float16.Float16. Code that holds a typed slice uses
// BufferOf.
func Elements(flat any) (Buffer, error) {
	switch b := flat.(type) {
	case []float32:
		return BufferOf(b), nil
	case []float64:
		return BufferOf(b), nil
	case []int32:
		return BufferOf(b), nil
	case []int64:
		return BufferOf(b), nil
	case []byte:
		return BufferOf(b), nil
	case []bfloat16.BFloat16:
		return BufferOf(b), nil
	case []float16.Float16:
		return BufferOf(b), nil
	default:
		return Buffer{}, fmt.Errorf("backends: collective buffers must be []float32, []float64, []int32, "+
			"[]int64, []byte, []bfloat16.BFloat16 or []float16.Float16, got %T", flat)
	}
}

// sumInto adds src into dst element-wise; both must be of the same kind and length. Engines that reduce in
// Go (single, in-process) share it.
func sumInto(dst, src Buffer) error {
	if dst.Kind != src.Kind || dst.Len != src.Len {
		return fmt.Errorf("backends: mismatched collective buffers %s[%d] and %s[%d]", dst.Kind, dst.Len, src.Kind, src.Len)
	}
	switch dst.Kind {
	case Float32:
		addSlices(View[float32](dst), View[float32](src))
	case Float64:
		addSlices(View[float64](dst), View[float64](src))
	case Int32:
		addSlices(View[int32](dst), View[int32](src))
	case Int64:
		addSlices(View[int64](dst), View[int64](src))
	case BFloat16:
		addRounded(View[bfloat16.BFloat16](dst), View[bfloat16.BFloat16](src), half.SumBF16)
	case Float16:
		addRounded(View[float16.Float16](dst), View[float16.Float16](src), half.SumFP16)
	default:
		addSlices(View[uint8](dst), View[uint8](src))
	}
	return nil
}

func addSlices[T int32 | int64 | uint8 | float32 | float64](dst, src []T) {
	for i, v := range src {
		dst[i] += v
	}
}

// addRounded adds src into dst with a 16-bit format's sum (float32 addition, one rounding).
func addRounded[T bfloat16.BFloat16 | float16.Float16](dst, src []T, sum func(a, b T) T) {
	for i, v := range src {
		dst[i] = sum(dst[i], v)
	}
}

// copyInto copies src into dst (same kind, same length).
func copyInto(dst, src Buffer) error {
	if dst.Kind != src.Kind || dst.Len != src.Len {
		return fmt.Errorf("backends: mismatched collective buffers %s[%d] and %s[%d]", dst.Kind, dst.Len, src.Kind, src.Len)
	}
	copy(dst.bytes(), src.bytes())
	return nil
}

// cloneBuffer returns a copy of b in new memory.
func cloneBuffer(b Buffer) Buffer {
	c := b
	if b.Bytes > 0 {
		mem := make([]uint64, (b.Bytes+7)/8) // 8-byte aligned for every kind
		c.Ptr = unsafe.Pointer(&mem[0])
		copy(c.bytes(), b.bytes())
	}
	return c
}

// doneRequest is a request that completed when it was started.
type doneRequest struct{ err error }

func (r doneRequest) Test() (bool, error) { return true, r.err }
