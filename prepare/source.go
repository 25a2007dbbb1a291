package prepare

import (
	"errors"
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
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
		var bad, at int64 = 0, -1
		err := t.ConstFlatData(func(flat any) {
			switch f := flat.(type) {
			case []int32:
				bad, at = firstOutside(f, classes)
			case []int64:
				bad, at = firstOutside(f, classes)
			case []uint8:
				bad, at = firstOutside(f, classes)
			case []int8:
				bad, at = firstOutside(f, classes)
			case []int16:
				bad, at = firstOutside(f, classes)
			case []uint16:
				bad, at = firstOutside(f, classes)
			case []uint32:
				bad, at = firstOutside(f, classes)
			default:
				at = -2
			}
		})
		if err != nil {
			return fmt.Errorf("prepare: tensor source: labels #%d: %w", i, err)
		}
		if at == -2 {
			return fmt.Errorf("prepare: tensor source: SparseLabels needs integer labels, labels #%d is %s", i, t.DType())
		}
		if at >= 0 {
			perExample := max(t.Shape().Size()/t.Shape().Dimensions[0], 1)
			return fmt.Errorf("prepare: tensor source: labels #%d of example %d is %d, not a class in [0, %d)", i,
				at/int64(perExample), bad, classes)
		}
	}
	return nil
}

// firstOutside returns the first value outside [0, classes) and its flat index, or index -1.
func firstOutside[T int8 | int16 | int32 | int64 | uint8 | uint16 | uint32](flat []T, classes int) (value, index int64) {
	for i, v := range flat {
		if int64(v) < 0 || int64(v) >= int64(classes) {
			return int64(v), int64(i)
		}
	}
	return 0, -1
}

func (s *tensorSource) Len() int { return s.n }

func (s *tensorSource) Batch(indices []int) (inputs, labels []*tensors.Tensor, err error) {
	if inputs, err = gatherRows(s.inputs, indices); err != nil {
		return nil, nil, err
	}
	if labels, err = gatherRows(s.labels, indices); err != nil {
		return nil, nil, err
	}
	return inputs, labels, nil
}

// gatherRows copies the rows at indices of each tensor into new tensors, byte-wise, whatever the dtype.
func gatherRows(ts []*tensors.Tensor, indices []int) ([]*tensors.Tensor, error) {
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
		batch := tensors.FromShape(shapes.Make(s.DType, dims...))
		out[i] = batch
		if batch.Shape().Size() == 0 {
			continue // nothing to copy, and GoMLX's byte views need at least one element
		}
		rowBytes := int(s.Memory()) / rows
		var copyErr error
		err := t.ConstBytes(func(src []byte) {
			copyErr = batch.MutableBytes(func(dst []byte) {
				for j, idx := range indices {
					copy(dst[j*rowBytes:(j+1)*rowBytes], src[idx*rowBytes:(idx+1)*rowBytes])
				}
			})
		})
		if err == nil {
			err = copyErr
		}
		if err != nil {
			return nil, fmt.Errorf("prepare: gathering examples: %w", err)
		}
	}
	return out, nil
}
