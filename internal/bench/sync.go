package bench

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// syncResult compares ways of all-reducing one model's gradients across the ranks.
type syncResult struct {
	Ranks   int
	Model   string
	Tensors int   // gradient tensors
	Bytes   int64 // of all gradients
	// Flat is one all-reduce of all the bytes; PerTensor the loop a user writes by hand, one blocking
	// all-reduce per gradient tensor; PerTensorAsync starts one all-reduce per tensor, then waits for all.
	Flat, PerTensor, PerTensorAsync series
	Caps                            []capResult // goaccel's bucketed sync, per bucket cap
}

// capResult is the bucketed sync for one bucket cap.
type capResult struct {
	CapBytes    int64
	BucketBytes []int64 // the buckets' sizes: two caps with the same sizes made the same plan
	// Pipelined is accumulate.Reducer.Sync: every bucket's all-reduce is started, then all are waited
	// for. Sequential reduces the same buckets one after another with blocking all-reduces.
	Pipelined, Sequential series
}

// bucketSet is a plan with host buffers for its buckets, as the model's accumulators would hold them.
type bucketSet struct {
	plan    accumulate.Plan
	tensors []*tensors.Tensor
	flats   [][]float32
}

func newBucketSet(params []accumulate.Param, firstBytes, capBytes int64) (*bucketSet, error) {
	plan, err := accumulate.NewPlan(params, firstBytes, capBytes)
	if err != nil {
		return nil, err
	}
	return bucketsFor(plan)
}

// bucketsFor allocates zeroed host buffers for a plan's buckets.
func bucketsFor(plan accumulate.Plan) (*bucketSet, error) {
	s := &bucketSet{plan: plan}
	for _, b := range plan.Buckets {
		t := tensors.FromShape(shapes.Make(b.DType, b.Size))
		var flat []float32
		if err := t.MutableFlatData(func(f any) { flat, _ = f.([]float32) }); err != nil {
			return nil, err
		}
		if flat == nil {
			return nil, fmt.Errorf("bench: bucket of dtype %s; the measurements use float32 models", b.DType)
		}
		s.tensors = append(s.tensors, t)
		s.flats = append(s.flats, flat)
	}
	return s, nil
}

// measureSync times the gradient sync of m under every strategy: the bucketed Reducer for each cap (and
// the same buckets reduced sequentially), one flat all-reduce, and one all-reduce per tensor. Buffers hold
// zeros, so repeated sums stay finite. Collective.
func measureSync(comm *backends.Communicator, barrier func() error, m mlp, capsBytes []int64, t timing) (syncResult, error) {
	params := m.params()
	res := syncResult{Ranks: comm.Size(), Model: m.describe(), Tensors: len(params), Bytes: m.bytes()}
	name := func(v string) string { return fmt.Sprintf("GradientSync/%s/ranks=%d", v, comm.Size()) }
	flat, err := newBucketSet(params, res.Bytes, res.Bytes)
	if err != nil {
		return res, err
	}
	perTensor, err := newBucketSet(params, 1, 1) // a cap below every tensor: one bucket each
	if err != nil {
		return res, err
	}
	variants := []variant{
		{name("flat"), reducerLoop(comm, flat)},
		{name("per-tensor"), sequentialLoop(comm, perTensor)},
		{name("per-tensor-async"), reducerLoop(comm, perTensor)},
	}
	for _, capBytes := range capsBytes {
		set, err := newBucketSet(params, 0, capBytes)
		if err != nil {
			return res, err
		}
		c := capResult{CapBytes: capBytes}
		for _, b := range set.plan.Buckets {
			c.BucketBytes = append(c.BucketBytes, int64(b.Bytes()))
		}
		res.Caps = append(res.Caps, c)
		variants = append(variants,
			variant{name("bucketed/cap=" + formatBytes(capBytes)), reducerLoop(comm, set)},
			variant{name("sequential/cap=" + formatBytes(capBytes)), sequentialLoop(comm, set)})
	}
	s, err := group{comm: comm, barrier: barrier, timing: t}.measure(variants...)
	if err != nil {
		return res, fmt.Errorf("gradient sync: %w", err)
	}
	for i := range s {
		s[i].Bytes = res.Bytes
	}
	res.Flat, res.PerTensor, res.PerTensorAsync = s[0], s[1], s[2]
	for i := range res.Caps {
		res.Caps[i].Pipelined, res.Caps[i].Sequential = s[3+2*i], s[4+2*i]
	}
	return res, nil
}

// reducerLoop syncs the buckets with goaccel's Reducer, as a training step does.
func reducerLoop(comm *backends.Communicator, set *bucketSet, opts ...accumulate.ReducerOption) func(int) error {
	r := accumulate.NewReducer(comm, set.plan, opts...)
	return func(iters int) error {
		for range iters {
			if err := r.Sync(set.tensors); err != nil {
				return err
			}
		}
		return nil
	}
}

// sequentialLoop all-reduces the buckets one at a time, each waited for before the next starts.
func sequentialLoop(comm *backends.Communicator, set *bucketSet) func(int) error {
	return func(iters int) error {
		for range iters {
			for _, flat := range set.flats {
				if err := comm.AllReduceSum(backends.BufferOf(flat)); err != nil {
					return err
				}
			}
		}
		return nil
	}
}
