package accumulate

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
)

// PowerSGDConfig configures the PowerSGD comm hook, as PyTorch's PowerSGDState does.
type PowerSGDConfig struct {
	// Rank is r, the rank of each matrix's approximation P·Qᵀ (PyTorch's matrix_approximation_rank).
	// Default 1.
	Rank int
	// StartIter is the number of syncs that all-reduce in full before compression starts (PyTorch's
	// start_powerSGD_iter, default 1000): the first steps of training move fast, and vanilla all-reduce
	// there keeps the accuracy. 0 compresses from the first sync.
	StartIter int
	// MinCompressionRate leaves a matrix uncompressed unless n·m > MinCompressionRate·r·(n+m), as PyTorch's
	// min_compression_rate (default 2): a small matrix costs more to compress than it saves.
	MinCompressionRate float64
	// NoWarmStart draws a fresh Q every sync instead of reusing the last one (PyTorch's warm_start=False).
	NoWarmStart bool
	// NoErrorFeedback drops what the approximation missed instead of adding it to the next sync's
	// gradient (PyTorch's use_error_feedback=False).
	NoErrorFeedback bool
	// Seed seeds the random Q every rank draws alike (default 0, as PyTorch's).
	Seed uint64
}

func (c PowerSGDConfig) withDefaults() PowerSGDConfig {
	if c.Rank == 0 {
		c.Rank = 1
	}
	if c.MinCompressionRate == 0 {
		c.MinCompressionRate = 2
	}
	return c
}

// PowerSGDHook is the CommHook of PowerSGD (Vogels et al., 2019; PyTorch's powerSGD_hook): each gradient
// matrix M (a parameter of two or more axes, viewed as its first axis × the rest) is all-reduced as two
// thin factors instead of itself: P = M·Q (n×r) is summed across ranks and orthonormalised, Q = Mᵀ·P
// (m×r) is summed, and P·Qᵀ, the sum's projection on P's columns, replaces the sum. With error feedback
// each rank adds what the approximation missed of its own gradient to its next one; with warm start Q
// carries over from sync to sync. Vectors (biases, norms' scales) and matrices too small to gain travel
// uncompressed, in one all-reduce per bucket. Before StartIter syncs everything travels uncompressed.
//
// It composes with gradient accumulation (it runs on syncs only) and does nothing on one process (the
// reducer makes no call there). Its state — the sync count, each matrix's Q (the same on every rank) and
// error (each rank's own) — is what an exact resume needs: MarshalBinary and UnmarshalBinary carry it, and
// the Accelerator saves it in checkpoints.
//
// Unlike the exact all-reduce the result is an approximation of the sum: how close depends on the rank
// and on the gradients' spectrum (docs/semantics.md section 10).
type PowerSGDHook struct {
	cfg PowerSGDConfig

	mu sync.Mutex
	// syncs counts the syncs begun: bucket 0 starts one (the reducer starts a sync's buckets in order).
	syncs    int64
	matrices map[matrixKey]*matrixState
	stats    HookStats
}

// matrixKey names a matrix: its bucket and its slot in the bucket.
type matrixKey struct{ bucket, slot int }

// matrixState is one matrix's carried state: Q (m×r, the same on every rank) and this rank's error (n·m).
type matrixState struct {
	q, err []float32
}

// HookStats counts what a comm hook sent: buckets (and syncs) in full and compressed, and the elements
// that travelled against those a plain all-reduce would have sent.
type HookStats struct {
	Syncs, CompressedSyncs int64
	// Elements are what travelled; Uncompressed, what a plain all-reduce would have sent for the same
	// buckets.
	Elements, Uncompressed int64
}

// Ratio is the compression ratio so far: uncompressed elements over those sent (1 before any sync).
func (s HookStats) Ratio() float64 {
	if s.Elements == 0 {
		return 1
	}
	return float64(s.Uncompressed) / float64(s.Elements)
}

// StatsReporter is implemented by comm hooks that count what they sent.
type StatsReporter interface {
	Stats() HookStats
}

// NewPowerSGDHook returns a PowerSGD hook.
func NewPowerSGDHook(cfg PowerSGDConfig) (*PowerSGDHook, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.Rank < 1 || cfg.Rank > 1<<10:
		return nil, fmt.Errorf("accumulate: PowerSGD's rank must be from 1 to 1024, got %d", cfg.Rank)
	case cfg.StartIter < 0:
		return nil, fmt.Errorf("accumulate: PowerSGD's start iteration must not be negative, got %d", cfg.StartIter)
	case !(cfg.MinCompressionRate >= 1) || math.IsInf(cfg.MinCompressionRate, 0):
		return nil, fmt.Errorf("accumulate: PowerSGD's minimum compression rate must be at least 1, got %g",
			cfg.MinCompressionRate)
	}
	return &PowerSGDHook{cfg: cfg, matrices: map[matrixKey]*matrixState{}}, nil
}

// Config is the hook's configuration, defaults filled in.
func (h *PowerSGDHook) Config() PowerSGDConfig { return h.cfg }

// Name implements CommHook: the configuration, which every rank must share.
func (h *PowerSGDHook) Name() string {
	c := h.cfg
	return fmt.Sprintf("powersgd(rank=%d, start=%d, min-rate=%g, warm-start=%t, error-feedback=%t, seed=%d)",
		c.Rank, c.StartIter, c.MinCompressionRate, !c.NoWarmStart, !c.NoErrorFeedback, c.Seed)
}

// Stats implements StatsReporter.
func (h *PowerSGDHook) Stats() HookStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// matrixView is where a bucket's slot sits as a matrix: n rows of m elements from offset.
type matrixView struct {
	slot, offset, n, m int
}

// views splits a bucket into the matrices worth compressing and the rest.
func (h *PowerSGDHook) views(b GradBucket) (matrices []matrixView, rest [][2]int) {
	r := h.cfg.Rank
	for s, slot := range b.Layout.Slots {
		dims := b.Params[slot.Param].Shape.Dimensions
		if len(dims) >= 2 {
			n := dims[0]
			m := slot.Size / max(n, 1)
			if float64(n)*float64(m) > h.cfg.MinCompressionRate*float64(r)*float64(n+m) {
				matrices = append(matrices, matrixView{slot: s, offset: slot.Offset, n: n, m: m})
				continue
			}
		}
		rest = append(rest, [2]int{slot.Offset, slot.Offset + slot.Size})
	}
	return matrices, rest
}

// Start implements CommHook. It refuses a strategy that splits buckets: the factors are all-reduced whole.
func (h *PowerSGDHook) Start(comm *backends.Communicator, sharding Sharding, b GradBucket) (Waiter, error) {
	if sharding.Stage() != 0 {
		return nil, fmt.Errorf("accumulate: PowerSGD all-reduces each bucket's factors whole and cannot run under "+
			"the %s sharding strategy", sharding.Name())
	}
	if b.Buffer.Kind != backends.Float32 {
		return nil, fmt.Errorf("accumulate: PowerSGD compresses float32 buckets; bucket %d holds %s", b.Index,
			b.Buffer.Kind)
	}
	for _, slot := range b.Layout.Slots {
		if slot.Param >= len(b.Params) {
			return nil, fmt.Errorf("accumulate: PowerSGD needs the parameters' shapes of bucket %d", b.Index)
		}
	}
	h.mu.Lock()
	if b.Index == 0 {
		h.syncs++
	}
	compress := h.syncs > int64(h.cfg.StartIter)
	h.stats.Uncompressed += int64(b.Buffer.Len)
	if b.Index == 0 {
		h.stats.Syncs++
		if compress {
			h.stats.CompressedSyncs++
		}
	}
	h.mu.Unlock()
	if !compress {
		h.count(int64(b.Buffer.Len))
		return sharding.StartReduce(comm, b.Buffer, b.Shard)
	}
	return h.startCompressed(comm, b)
}

func (h *PowerSGDHook) count(elements int64) {
	h.mu.Lock()
	h.stats.Elements += elements
	h.mu.Unlock()
}

// state is matrix key's carried state, made on first use: Q drawn from the seed (the same on every rank)
// and a zero error.
func (h *PowerSGDHook) state(key matrixKey, v matrixView) *matrixState {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.matrices[key]
	if st == nil || len(st.q) != v.m*h.cfg.Rank || len(st.err) != v.n*v.m {
		st = &matrixState{q: make([]float32, v.m*h.cfg.Rank), err: make([]float32, v.n*v.m)}
		h.drawQ(key, st.q, 0)
		h.matrices[key] = st
	}
	return st
}

// drawQ fills q with standard normal values from the seed, the matrix and the sync (every rank draws the
// same).
func (h *PowerSGDHook) drawQ(key matrixKey, q []float32, sync int64) {
	rng := rand.New(rand.NewPCG(h.cfg.Seed^uint64(key.bucket)<<32^uint64(key.slot), uint64(sync)))
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
}

// compressed is one bucket's compressed sync in flight.
type compressed struct {
	h        *PowerSGDHook
	comm     *backends.Communicator
	b        GradBucket
	bucket   []float32
	matrices []matrixView
	states   []*matrixState
	inputs   [][]float32 // each matrix's gradient with its error added, as compressed
	ps       []float32   // every matrix's P, end to end
	rest     []float32   // the uncompressed elements, end to end
	restAt   [][2]int
	pDone    Waiter
	restDone Waiter

	once sync.Once
	err  error
}

func (h *PowerSGDHook) startCompressed(comm *backends.Communicator, b GradBucket) (Waiter, error) {
	r := h.cfg.Rank
	c := &compressed{h: h, comm: comm, b: b, bucket: backends.View[float32](b.Buffer)}
	c.matrices, c.restAt = h.views(b)
	pLen := 0
	for _, v := range c.matrices {
		pLen += v.n * r
	}
	c.ps = make([]float32, pLen)
	h.mu.Lock()
	sync := h.syncs
	h.mu.Unlock()
	at := 0
	for _, v := range c.matrices {
		key := matrixKey{b.Index, v.slot}
		st := h.state(key, v)
		if h.cfg.NoWarmStart {
			h.drawQ(key, st.q, sync)
		}
		m := append([]float32(nil), c.bucket[v.offset:v.offset+v.n*v.m]...)
		if !h.cfg.NoErrorFeedback {
			for i, e := range st.err {
				m[i] += e
			}
		}
		cpu.Gemm32(v.n, r, v.m, false, false, m, st.q, c.ps[at:at+v.n*r]) // P = M·Q
		c.states = append(c.states, st)
		c.inputs = append(c.inputs, m)
		at += v.n * r
	}
	for _, span := range c.restAt {
		c.rest = append(c.rest, c.bucket[span[0]:span[1]]...)
	}
	var err error
	if len(c.rest) > 0 {
		if c.restDone, err = comm.AllReduceSumAsync(backends.BufferOf(c.rest)); err != nil {
			return nil, err
		}
	}
	if len(c.ps) > 0 {
		if c.pDone, err = comm.AllReduceSumAsync(backends.BufferOf(c.ps)); err != nil {
			if c.restDone != nil {
				_ = c.restDone.Wait()
			}
			return nil, err
		}
	}
	h.count(int64(len(c.rest) + len(c.ps)))
	return c, nil
}

// Wait finishes the sync: orthonormalise the summed P, compute and sum Q = Mᵀ·P, and write P·Qᵀ and the
// summed uncompressed elements into the bucket.
func (c *compressed) Wait() error {
	c.once.Do(func() { c.err = c.finish() })
	return c.err
}

func (c *compressed) finish() error {
	r := c.h.cfg.Rank
	var errs []error
	if c.pDone != nil {
		errs = append(errs, c.pDone.Wait())
	}
	if c.restDone != nil {
		errs = append(errs, c.restDone.Wait())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	qLen := 0
	for _, v := range c.matrices {
		qLen += v.m * r
	}
	qs := make([]float32, qLen)
	pAt, qAt := 0, 0
	for i, v := range c.matrices {
		p := c.ps[pAt : pAt+v.n*r]
		orthonormalize(p, v.n, r)
		cpu.Gemm32(v.m, r, v.n, true, false, c.inputs[i], p, qs[qAt:qAt+v.m*r]) // Q = Mᵀ·P
		pAt, qAt = pAt+v.n*r, qAt+v.m*r
	}
	if len(qs) > 0 {
		if err := c.comm.AllReduceSum(backends.BufferOf(qs)); err != nil {
			return err
		}
		c.h.count(int64(len(qs)))
	}
	size := float32(c.comm.Size())
	pAt, qAt = 0, 0
	for i, v := range c.matrices {
		p, q := c.ps[pAt:pAt+v.n*r], qs[qAt:qAt+v.m*r]
		out := c.bucket[v.offset : v.offset+v.n*v.m]
		cpu.Gemm32(v.n, v.m, r, false, true, p, q, out) // P·Qᵀ
		st := c.states[i]
		if !c.h.cfg.NoErrorFeedback {
			// What this rank's share of the approximated sum missed of its own gradient.
			for j := range st.err {
				st.err[j] = c.inputs[i][j] - out[j]/size
			}
		}
		if !c.h.cfg.NoWarmStart {
			c.h.mu.Lock()
			copy(st.q, q)
			c.h.mu.Unlock()
		}
		pAt, qAt = pAt+v.n*r, qAt+v.m*r
	}
	at := 0
	for _, span := range c.restAt {
		at += copy(c.bucket[span[0]:span[1]], c.rest[at:])
	}
	return nil
}

// orthonormalize makes p's r columns (p is n×r, row-major) orthonormal by Gram-Schmidt, in float64; a
// column with no norm left stays zero.
func orthonormalize(p []float32, n, r int) {
	col := make([]float64, n)
	done := make([][]float64, 0, r)
	for k := range r {
		for i := range n {
			col[i] = float64(p[i*r+k])
		}
		for _, prev := range done {
			var dot float64
			for i := range n {
				dot += prev[i] * col[i]
			}
			for i := range n {
				col[i] -= dot * prev[i]
			}
		}
		var norm float64
		for _, x := range col {
			norm += x * x
		}
		norm = math.Sqrt(norm)
		unit := make([]float64, n)
		if norm > 0 {
			for i := range n {
				unit[i] = col[i] / norm
			}
		}
		for i := range n {
			p[i*r+k] = float32(unit[i])
		}
		done = append(done, unit)
	}
}

// powerSGDStateVersion is the first byte of MarshalBinary's format.
const powerSGDStateVersion = 1

// MarshalBinary saves the hook's state: the sync count and every matrix's Q and error, in key order.
func (h *PowerSGDHook) MarshalBinary() ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var buf bytes.Buffer
	buf.WriteByte(powerSGDStateVersion)
	put := func(v any) { _ = binary.Write(&buf, binary.LittleEndian, v) }
	put(h.syncs)
	put(h.stats)
	keys := sortedKeys(h.matrices)
	put(int64(len(keys)))
	for _, k := range keys {
		st := h.matrices[k]
		put([2]int64{int64(k.bucket), int64(k.slot)})
		put(int64(len(st.q)))
		put(st.q)
		put(int64(len(st.err)))
		put(st.err)
	}
	return buf.Bytes(), nil
}

// UnmarshalBinary restores MarshalBinary's state; it refuses bytes it cannot read whole, and then leaves the
// hook as it was.
func (h *PowerSGDHook) UnmarshalBinary(data []byte) error {
	if len(data) == 0 || data[0] != powerSGDStateVersion {
		return errors.New("accumulate: not a PowerSGD state (wrong version)")
	}
	rd := bytes.NewReader(data[1:])
	get := func(v any) error { return binary.Read(rd, binary.LittleEndian, v) }
	var syncs int64
	var stats HookStats
	var count int64
	if err := errors.Join(get(&syncs), get(&stats), get(&count)); err != nil {
		return fmt.Errorf("accumulate: PowerSGD state: %w", err)
	}
	if syncs < 0 || count < 0 || count > int64(len(data)) {
		return errors.New("accumulate: PowerSGD state: negative or impossible counts")
	}
	matrices := map[matrixKey]*matrixState{}
	for range count {
		var key [2]int64
		var n int64
		if err := errors.Join(get(&key), get(&n)); err != nil {
			return fmt.Errorf("accumulate: PowerSGD state: %w", err)
		}
		if n < 0 || n > int64(rd.Len())/4 {
			return errors.New("accumulate: PowerSGD state: a Q longer than the data")
		}
		st := &matrixState{q: make([]float32, n)}
		if err := errors.Join(get(st.q), get(&n)); err != nil {
			return fmt.Errorf("accumulate: PowerSGD state: %w", err)
		}
		if n < 0 || n > int64(rd.Len())/4 {
			return errors.New("accumulate: PowerSGD state: an error longer than the data")
		}
		st.err = make([]float32, n)
		if err := get(st.err); err != nil {
			return fmt.Errorf("accumulate: PowerSGD state: %w", err)
		}
		matrices[matrixKey{int(key[0]), int(key[1])}] = st
	}
	if rd.Len() != 0 {
		return fmt.Errorf("accumulate: PowerSGD state: %d bytes after the end", rd.Len())
	}
	h.mu.Lock()
	h.syncs, h.stats, h.matrices = syncs, stats, matrices
	h.mu.Unlock()
	return nil
}

// ResizeState is the state a rank of a run of another number of processes takes from a checkpoint's
// states (every saved rank's, by rank): saved rank 0's sync count and Qs (the same on every rank), and zero
// errors, since the saved ranks' errors belong to gradients of data this run splits otherwise.
func (h *PowerSGDHook) ResizeState(saved [][]byte, _, _ int) ([]byte, error) {
	if len(saved) == 0 {
		return nil, errors.New("accumulate: no PowerSGD state saved")
	}
	tmp := &PowerSGDHook{cfg: h.cfg}
	if err := tmp.UnmarshalBinary(saved[0]); err != nil {
		return nil, err
	}
	for _, st := range tmp.matrices {
		clear(st.err)
	}
	return tmp.MarshalBinary()
}

func sortedKeys(m map[matrixKey]*matrixState) []matrixKey {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b matrixKey) int { return cmp.Or(cmp.Compare(a.bucket, b.bucket), cmp.Compare(a.slot, b.slot)) })
	return keys
}
