package prepare

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/internal/classlabels"
)

// Source is an indexable dataset: Len examples, any of which can be gathered into a batch. The data
// loader shards sources by index, so every rank can compute every epoch's order without talking.
type Source interface {
	Len() int
	// Batch gathers the examples at indices (in that order) into input and label tensors whose first
	// dimension is len(indices).
	Batch(indices []int) (inputs, labels []*tensors.Tensor, err error)
}

// tensorSource serves examples from in-memory tensors whose first axis indexes examples.
type tensorSource struct {
	inputs, labels []*tensors.Tensor
	n              int
}

// SourceOption configures TensorSource.
type SourceOption func(*sourceConfig)

type sourceConfig struct {
	classes int // > 0: every label must be a class index in [0, classes)
}

// SparseLabels declares that the labels are class indices for a classifier of classes classes: TensorSource
// then checks that every label is an integer in [0, classes). A sparse cross-entropy gives an
// out-of-range label a loss of 0 instead of an error, so a wrong label file would otherwise train silently.
func SparseLabels(classes int) SourceOption { return func(c *sourceConfig) { c.classes = classes } }

// TensorSource is a Source over in-memory tensors: every tensor's first axis indexes the examples, and all
// must agree on the number of examples.
func TensorSource(inputs, labels []*tensors.Tensor, opts ...SourceOption) (Source, error) {
	var cfg sourceConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	if len(inputs) == 0 {
		return nil, errors.New("prepare: tensor source needs at least one input tensor")
	}
	all := append(append([]*tensors.Tensor{}, inputs...), labels...)
	n := -1
	for i, t := range all {
		if t == nil {
			return nil, fmt.Errorf("prepare: tensor source: tensor #%d is nil", i)
		}
		s := t.Shape()
		if s.Rank() == 0 {
			return nil, fmt.Errorf("prepare: tensor source: tensor #%d is a scalar; the first axis must index examples", i)
		}
		if n >= 0 && s.Dimensions[0] != n {
			return nil, fmt.Errorf("prepare: tensor source: tensor #%d has %d examples, tensor #0 has %d", i, s.Dimensions[0], n)
		}
		n = s.Dimensions[0]
	}
	if cfg.classes != 0 {
		if err := checkClasses(labels, cfg.classes); err != nil {
			return nil, err
		}
	}
	return &tensorSource{inputs: inputs, labels: labels, n: n}, nil
}

// checkClasses verifies that every label is a class index in [0, classes).
func checkClasses(labels []*tensors.Tensor, classes int) error {
	if classes < 1 {
		return fmt.Errorf("prepare: tensor source: SparseLabels needs at least 1 class, got %d", classes)
	}
	if len(labels) == 0 {
		return errors.New("prepare: tensor source: SparseLabels given, but there are no labels")
	}
	for i, t := range labels {
		bad, example, err := firstLabelOutside(t, classes)
		if err != nil {
			return fmt.Errorf("prepare: tensor source: labels #%d: %w", i, err)
		}
		if example >= 0 {
			return fmt.Errorf("prepare: tensor source: labels #%d of example %d is %d, not a class in [0, %d)", i,
				example, bad, classes)
		}
	}
	return nil
}

// firstLabelOutside returns the first label of t outside [0, classes) and the example (index along t's
// first axis) that holds it, or example −1 when every label is a class. t must hold integers.
func firstLabelOutside(t *tensors.Tensor, classes int) (value int64, example int, err error) {
	values, err := classlabels.Int64s(t)
	if err != nil {
		return 0, -1, err
	}
	for i, v := range values {
		if v < 0 || v >= int64(classes) {
			perExample := max(t.Shape().Size()/max(t.Shape().Dimensions[0], 1), 1)
			return v, i / perExample, nil
		}
	}
	return 0, -1, nil
}

func (s *tensorSource) Len() int { return s.n }

func (s *tensorSource) Batch(indices []int) (inputs, labels []*tensors.Tensor, err error) {
	return s.batchOn(nil, indices)
}

// batchOn is Batch gathering into tensors of backend (nil: local tensors). The data loader calls it with its
// compute backend: where the backend's buffers are host memory, the examples are copied straight into one
// of its buffers, which the training step then reads in place instead of copying the batch into a buffer of
// its own first.
func (s *tensorSource) batchOn(backend gomlxbackends.Backend, indices []int) (inputs, labels []*tensors.Tensor, err error) {
	if inputs, err = gatherRows(backend, s.inputs, indices); err != nil {
		return nil, nil, err
	}
	if labels, err = gatherRows(backend, s.labels, indices); err != nil {
		return nil, nil, err
	}
	return inputs, labels, nil
}

// backendSource is a Source that can gather a batch into tensors of a compute backend.
type backendSource interface {
	batchOn(backend gomlxbackends.Backend, indices []int) (inputs, labels []*tensors.Tensor, err error)
}

// gatherRows copies the rows at indices of each tensor into new tensors, byte-wise, whatever the dtype.
func gatherRows(backend gomlxbackends.Backend, ts []*tensors.Tensor, indices []int) ([]*tensors.Tensor, error) {
	out := make([]*tensors.Tensor, len(ts))
	for i, t := range ts {
		s := t.Shape()
		rows := s.Dimensions[0]
		// Indices are checked before any copy: an error raised inside the byte-access callbacks is easy to
		// lose, and a bad index must never turn into a silently zeroed example.
		for _, idx := range indices {
			if idx < 0 || idx >= rows {
				return nil, fmt.Errorf("prepare: example index %d outside [0, %d)", idx, rows)
			}
		}
		dims := append([]int{len(indices)}, s.Dimensions[1:]...)
		batch, dst, err := newTensor(backend, shapes.Make(s.DType, dims...))
		if err != nil {
			return nil, fmt.Errorf("prepare: gathering examples: %w", err)
		}
		out[i] = batch
		if len(dst) == 0 {
			continue // nothing to copy, and GoMLX's byte views need at least one element
		}
		rowBytes := int(s.Memory()) / rows
		err = t.ConstBytes(func(src []byte) {
			for j, idx := range indices {
				copy(dst[j*rowBytes:(j+1)*rowBytes], src[idx*rowBytes:(idx+1)*rowBytes])
			}
		})
		if err != nil {
			return nil, fmt.Errorf("prepare: gathering examples: %w", err)
		}
	}
	return out, nil
}

// newTensor returns a new tensor of shape and its storage as bytes, to be written before the tensor is used.
// On a backend whose buffers are host memory the storage is one of the backend's buffers (what a graph
// execution takes without a copy); otherwise, and for a nil backend, it is local memory.
func newTensor(backend gomlxbackends.Backend, shape shapes.Shape) (*tensors.Tensor, []byte, error) {
	if shape.Size() == 0 {
		return tensors.FromShape(shape), nil, nil
	}
	if backend != nil && backend.HasSharedBuffers() {
		buffer, flat, err := backend.NewSharedBuffer(0, shape)
		if err != nil {
			return nil, nil, err
		}
		t, err := tensors.FromBuffer(backend, buffer)
		if err != nil {
			return nil, nil, err
		}
		return t, flatBytes(flat), nil
	}
	t := tensors.FromShape(shape)
	var storage []byte
	// The slice outlives the callback: the tensor owns it and nobody else holds the tensor yet.
	if err := t.MutableBytes(func(b []byte) { storage = b }); err != nil {
		return nil, nil, err
	}
	return t, storage, nil
}

// flatBytes views a flat slice of any element type as its bytes.
func flatBytes(flat any) []byte {
	v := reflect.ValueOf(flat)
	if v.Len() == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(v.UnsafePointer()), v.Len()*int(v.Type().Elem().Size()))
}
