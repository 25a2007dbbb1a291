package accel

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
)

// WaitForEveryone blocks until every rank reached it.
func (a *Accelerator) WaitForEveryone() error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	return a.comm.Barrier()
}

// MainProcessFirst runs fn on the main process first and on the others once it finished: for work that
// fills a cache the others then read (downloading, preprocessing). Every rank runs fn; an error on the main
// process still releases the others, which then run fn themselves.
func (a *Accelerator) MainProcessFirst(fn func() error) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if !a.IsMainProcess() {
		if err := a.comm.Barrier(); err != nil {
			return err
		}
	}
	fnErr := fn()
	if a.IsMainProcess() {
		if err := a.comm.Barrier(); err != nil {
			return err
		}
	}
	return fnErr
}

// Gather concatenates every rank's t along the first axis, ordered by rank. All ranks must pass tensors
// of the same shape (even batches guarantee it for batch outputs).
func (a *Accelerator) Gather(t *tensors.Tensor) (*tensors.Tensor, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	s := t.Shape()
	if s.Rank() == 0 {
		t = reshape(t, 1)
		s = t.Shape()
	}
	if err := replicas.CheckSameSignature(a.comm, "gathered tensor shapes", []string{s.String()}); err != nil {
		return nil, fmt.Errorf("accel: gather: %w", err)
	}
	size := a.comm.Size()
	dims := append([]int{s.Dimensions[0] * size}, s.Dimensions[1:]...)
	out := tensors.FromShape(shapes.Make(s.DType, dims...))
	if out.Shape().Size() == 0 {
		return out, nil
	}
	var gatherErr error
	err := t.ConstBytes(func(send []byte) {
		gatherErr = out.MutableBytes(func(recv []byte) { gatherErr = a.comm.AllGather(send, recv) })
	})
	if err == nil {
		err = gatherErr
	}
	if err != nil {
		return nil, fmt.Errorf("accel: gather: %w", err)
	}
	return out, nil
}

// GatherForMetrics gathers a per-example tensor computed on batch (its first axis indexes the batch's
// examples) from every rank and drops the examples that even batching repeated, so that every example of
// the dataset is counted exactly once.
func (a *Accelerator) GatherForMetrics(t *tensors.Tensor, batch prepare.Batch) (*tensors.Tensor, error) {
	s := t.Shape()
	if s.Rank() == 0 || s.Dimensions[0] != batch.Size() {
		return nil, fmt.Errorf("accel: gather for metrics: tensor of shape %s does not have the batch's %d examples "+
			"on its first axis", s, batch.Size())
	}
	all, err := a.Gather(t)
	if err != nil {
		return nil, err
	}
	if len(batch.ValidPerRank) != a.comm.Size() {
		return all, nil
	}
	rows := s.Dimensions[0]
	var keep []int
	for r, valid := range batch.ValidPerRank {
		for j := range min(valid, rows) {
			keep = append(keep, r*rows+j)
		}
	}
	if len(keep) == all.Shape().Dimensions[0] {
		return all, nil
	}
	src, err := prepare.TensorSource([]*tensors.Tensor{all}, nil)
	if err != nil {
		return nil, err
	}
	kept, _, err := src.Batch(keep)
	if err != nil {
		return nil, err
	}
	return kept[0], nil
}

// ReduceOp is the reduction Reduce applies.
type ReduceOp int

// Reductions.
const (
	Sum ReduceOp = iota
	Mean
)

// Reduce sums (or averages) t element-wise across ranks and returns the result; t is not modified.
// float32, float64, int32 and int64 tensors are supported.
func (a *Accelerator) Reduce(t *tensors.Tensor, op ReduceOp) (*tensors.Tensor, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	if err := replicas.CheckSameSignature(a.comm, "reduced tensor shapes", []string{t.Shape().String()}); err != nil {
		return nil, fmt.Errorf("accel: reduce: %w", err)
	}
	out, err := t.LocalClone()
	if err != nil {
		return nil, err
	}
	if out.Shape().Size() == 0 {
		return out, nil
	}
	var reduceErr error
	err = out.MutableFlatData(func(flat any) {
		if reduceErr = a.comm.AllReduceSum(flat); reduceErr != nil || op != Mean {
			return
		}
		n := a.comm.Size()
		switch f := flat.(type) {
		case []float32:
			for i := range f {
				f[i] /= float32(n)
			}
		case []float64:
			for i := range f {
				f[i] /= float64(n)
			}
		default:
			reduceErr = fmt.Errorf("accel: mean of %s tensors is not defined; use Sum", t.DType())
		}
	})
	if err == nil {
		err = reduceErr
	}
	if err != nil {
		return nil, fmt.Errorf("accel: reduce: %w", err)
	}
	return out, nil
}

// Broadcast overwrites t on every rank with root's value, in place.
func (a *Accelerator) Broadcast(t *tensors.Tensor, root int) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if err := replicas.CheckSameSignature(a.comm, "broadcast tensor shapes", []string{t.Shape().String()}); err != nil {
		return fmt.Errorf("accel: broadcast: %w", err)
	}
	if t.Shape().Size() == 0 {
		return nil
	}
	var bcastErr error
	err := t.MutableBytes(func(data []byte) { bcastErr = a.comm.Broadcast(data, root) })
	if err == nil {
		err = bcastErr
	}
	return err
}

func reshape(t *tensors.Tensor, dims ...int) *tensors.Tensor {
	out := tensors.FromShape(shapes.Make(t.DType(), dims...))
	_ = t.ConstBytes(func(src []byte) { _ = out.MutableBytes(func(dst []byte) { copy(dst, src) }) })
	return out
}
