package accel

import (
	"errors"
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/floats"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
)

// WaitForEveryone blocks until every rank reached it. It checks that every rank is in WaitForEveryone (and
// not in another collective) like the other collectives of this file.
func (a *Accelerator) WaitForEveryone() error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	// Agreeing on the call is itself a barrier: no rank gets every rank's description before all sent one.
	if err := a.agreeOnCall("WaitForEveryone", nil); err != nil {
		return fmt.Errorf("accel: wait for everyone: %w", err)
	}
	return nil
}

// MainProcessFirst runs fn on the main process first and on the others once it finished: for work that
// fills a cache the others then read (downloading, preprocessing). Every rank runs fn; an error on the main
// process still releases the others, which then run fn themselves.
func (a *Accelerator) MainProcessFirst(fn func() error) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if fn == nil {
		return errors.New("accel: main process first: nil function")
	}
	barrier := func() error {
		if err := a.agreeOnCall("MainProcessFirst", nil); err != nil {
			return fmt.Errorf("accel: main process first: %w", err)
		}
		return nil
	}
	if !a.IsMainProcess() {
		if err := barrier(); err != nil {
			return err
		}
	}
	fnErr := fn()
	if a.IsMainProcess() {
		if err := barrier(); err != nil {
			return err
		}
	}
	return fnErr
}

// agreeOnCall verifies that every rank is making the same user-facing collective call with a tensor of
// the same dtype and shape. Two ranks in different collectives would otherwise match each other's
// messages: a Broadcast against a Gather "succeeds" with garbage, a Reduce against a Broadcast returns
// wrong sums, other pairs end in MPI_ERR_TRUNCATE. It costs one all-gather of a hash per call. A mismatch is
// the same error on every rank, naming what each rank called.
func (a *Accelerator) agreeOnCall(call string, t *tensors.Tensor) error {
	tensor := "none"
	if t != nil {
		tensor = t.Shape().String()
	}
	return a.agreeOnCallDescribed(call, tensor)
}

// agreeOnCallDescribed is agreeOnCall with the tensor already described (for calls where part of its
// shape may differ across ranks).
func (a *Accelerator) agreeOnCallDescribed(call, tensor string) error {
	if a.WorldSize() == 1 {
		return nil
	}
	return replicas.CheckSameSettings(a.comm, []replicas.Setting{
		{Name: "the collective called", Value: call},
		{Name: "the tensor passed to " + call, Value: tensor},
	})
}

// Gather concatenates every rank's t along the first axis, ordered by rank. All ranks must pass tensors
// of the same shape (even batches guarantee it for batch outputs); every rank checks that all of them
// called Gather with the same shape before any data moves.
func (a *Accelerator) Gather(t *tensors.Tensor) (*tensors.Tensor, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	if err := a.agreeOnCall("Gather", t); err != nil {
		return nil, fmt.Errorf("accel: gather: %w", err)
	}
	if t == nil {
		return nil, errors.New("accel: gather: tensor is nil")
	}
	return a.gather(t)
}

// gather is Gather once the ranks agreed on the call.
func (a *Accelerator) gather(t *tensors.Tensor) (*tensors.Tensor, error) {
	s := t.Shape()
	if s.Rank() == 0 {
		t = reshape(t, 1)
		s = t.Shape()
	}
	size := a.comm.Size()
	dims := append([]int{s.Dimensions[0] * size}, s.Dimensions[1:]...)
	out := tensors.FromShape(shapes.Make(s.DType, dims...))
	if out.Shape().Size() == 0 {
		return out, nil
	}
	var gatherErr error
	err := t.ConstBytes(func(send []byte) {
		gatherErr = out.MutableBytes(func(recv []byte) { gatherErr = a.comm.AllGather(backends.BufferOf(send), backends.BufferOf(recv)) })
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
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	// The batch size is part of the call: the checks below then fail alike on every rank.
	if err := a.agreeOnCall(fmt.Sprintf("GatherForMetrics(batch of %d)", batch.Size()), t); err != nil {
		return nil, fmt.Errorf("accel: gather for metrics: %w", err)
	}
	if t == nil {
		return nil, errors.New("accel: gather for metrics: tensor is nil")
	}
	s := t.Shape()
	if s.Rank() == 0 || s.Dimensions[0] != batch.Size() {
		return nil, fmt.Errorf("accel: gather for metrics: tensor of shape %s does not have the batch's %d examples "+
			"on its first axis", s, batch.Size())
	}
	all, err := a.gather(t)
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

func (op ReduceOp) String() string {
	switch op {
	case Sum:
		return "Sum"
	case Mean:
		return "Mean"
	}
	return fmt.Sprintf("ReduceOp(%d)", int(op))
}

// Reduce sums (or averages) t element-wise across ranks and returns the result; t is not modified.
// float32, float64, int32 and int64 tensors are supported.
func (a *Accelerator) Reduce(t *tensors.Tensor, op ReduceOp) (*tensors.Tensor, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	if err := a.agreeOnCall(fmt.Sprintf("Reduce(%s)", op), t); err != nil {
		return nil, fmt.Errorf("accel: reduce: %w", err)
	}
	if t == nil {
		return nil, errors.New("accel: reduce: tensor is nil")
	}
	if op != Sum && op != Mean {
		return nil, fmt.Errorf("accel: reduce: unknown reduction %s: use Sum or Mean", op)
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
		var buf backends.Buffer
		if buf, reduceErr = backends.Elements(flat); reduceErr != nil {
			return
		}
		if reduceErr = a.comm.AllReduceSum(buf); reduceErr != nil || op != Mean {
			return
		}
		n := float64(a.comm.Size())
		if !floats.Do(flat, divide[float32](n), divide[float64](n)) {
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

// divide divides every element by n, in place.
func divide[F floats.Float](n float64) func([]F) bool {
	return func(f []F) bool {
		for i := range f {
			f[i] /= F(n)
		}
		return true
	}
}

// Broadcast overwrites t on every rank with root's value, in place.
func (a *Accelerator) Broadcast(t *tensors.Tensor, root int) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if err := a.agreeOnCall(fmt.Sprintf("Broadcast(root %d)", root), t); err != nil {
		return fmt.Errorf("accel: broadcast: %w", err)
	}
	if t == nil {
		return errors.New("accel: broadcast: tensor is nil")
	}
	if root < 0 || root >= a.WorldSize() {
		return fmt.Errorf("accel: broadcast: root %d is not a rank of this job of %d", root, a.WorldSize())
	}
	if t.Shape().Size() == 0 {
		return nil
	}
	var bcastErr error
	err := t.MutableBytes(func(data []byte) { bcastErr = a.comm.Broadcast(backends.BufferOf(data), root) })
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
