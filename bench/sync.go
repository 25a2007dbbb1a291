package bench

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// SyncResult compares ways of all-reducing one model's gradients across the ranks.
type SyncResult struct {
	Ranks int    `json:"ranks"`
	Model string `json:"model"`
	// Tensors and Bytes describe the model's gradients.
	Tensors int   `json:"tensors"`
	Bytes   int64 `json:"bytes"`
	// Flat is one all-reduce of all the bytes; PerTensor is the loop a user writes by hand, one blocking
	// all-reduce per gradient tensor; PerTensorAsync starts one all-reduce per tensor and then waits for
	// all (the Reducer with a bucket per tensor).
	Flat           Series `json:"flat"`
	PerTensor      Series `json:"per_tensor"`
	PerTensorAsync Series `json:"per_tensor_async"`
	// Caps holds goaccel's bucketed sync for each bucket cap.
	Caps []CapResult `json:"caps"`
}

// CapResult is the bucketed sync for one bucket cap.
type CapResult struct {
	CapBytes int64 `json:"cap_bytes"`
	Buckets  int   `json:"buckets"`
	// BucketBytes are the buckets' sizes: two caps with the same sizes made the same plan.
	BucketBytes []int64 `json:"bucket_bytes"`
	// Pipelined is accumulate.Reducer.Sync: every bucket's all-reduce is started, then all are waited
	// for. Sequential reduces the same buckets one after another with blocking all-reduces.
	Pipelined  Series `json:"pipelined"`
	Sequential Series `json:"sequential"`
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

// MeasureSync times the gradient sync of model under every strategy: the bucketed Reducer for each cap
// in capsBytes (pipelined, and the same buckets reduced sequentially), one flat all-reduce, and one
// all-reduce per tensor. Buffers hold zeros, so repeated sums stay finite. Collective.
func MeasureSync(comm *backends.Communicator, barrier func() error, model MLP, capsBytes []int64, t Timing) (SyncResult, error) {
	params := model.Params()
	res := SyncResult{Ranks: comm.Size(), Model: model.Describe(), Tensors: len(params), Bytes: model.Bytes()}
	name := func(variant string) string { return fmt.Sprintf("GradientSync/%s/ranks=%d", variant, comm.Size()) }

	flat, err := newBucketSet(params, res.Bytes, res.Bytes)
	if err != nil {
		return res, err
	}
	perTensor, err := newBucketSet(params, 1, 1) // a cap below every tensor: one bucket each
	if err != nil {
		return res, err
	}
	variants := []Variant{
		{Name: name("flat"), Run: reducerLoop(comm, flat)},
		{Name: name("per-tensor"), Run: sequentialLoop(comm, perTensor)},
		{Name: name("per-tensor-async"), Run: reducerLoop(comm, perTensor)},
	}
	for _, capBytes := range capsBytes {
		set, err := newBucketSet(params, 0, capBytes)
		if err != nil {
			return res, err
		}
		c := CapResult{CapBytes: capBytes, Buckets: len(set.plan.Buckets)}
		for _, b := range set.plan.Buckets {
			c.BucketBytes = append(c.BucketBytes, int64(b.Bytes()))
		}
		res.Caps = append(res.Caps, c)
		variants = append(variants,
			Variant{Name: name("bucketed/cap=" + formatBytes(capBytes)), Run: reducerLoop(comm, set)},
			Variant{Name: name("sequential/cap=" + formatBytes(capBytes)), Run: sequentialLoop(comm, set)})
	}
	series, err := Group{Comm: comm, Barrier: barrier, Timing: t}.Measure(variants...)
	if err != nil {
		return res, fmt.Errorf("gradient sync: %w", err)
	}
	for i := range series {
		series[i].Bytes = res.Bytes
	}
	res.Flat, res.PerTensor, res.PerTensorAsync = series[0], series[1], series[2]
	for i := range res.Caps {
		res.Caps[i].Pipelined, res.Caps[i].Sequential = series[3+2*i], series[4+2*i]
	}
	return res, nil
}

// reducerLoop syncs the buckets with goaccel's Reducer, as a training step does.
func reducerLoop(comm *backends.Communicator, set *bucketSet) func(int) error {
	r := accumulate.NewReducer(comm, set.plan)
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
				if err := comm.AllReduceSum(flat); err != nil {
					return err
				}
			}
		}
		return nil
	}
}
