package prepare

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/floats"
)

// LocalSGD trains each process on its own gradients and averages the parameters every Steps optimizer
// steps, for jobs whose gradient all-reduce costs as much as the step itself (machines on ordinary
// Ethernet). Between averages no gradient travels: every Backward ends its cycle as inside NoSync would,
// and the optimizer applies the process's own mean gradient over the cycle's micro-batches. After every
// Steps-th optimizer step each parameter bucket is all-reduced once and divided by the number of
// processes, and every process continues from the mean (Accelerate's LocalSGD). The optimizer's state
// stays each process's own, as in Accelerate; the model's buffers (batch normalisation's moving averages)
// are averaged with the parameters and are each process's own in between.
//
// With Outer set it is DiLoCo: the processes keep a copy of the parameters as of the last average, θ_outer
// (identical on every process), and at each average take the pseudo-gradient Δ = θ_outer − mean(θ_local)
// as the gradient of an outer SGD step with Nesterov momentum on θ_outer; every process then continues
// from the new θ_outer. With an outer learning rate of 1 and no momentum DiLoCo is local SGD (up to
// float rounding).
type LocalSGD struct {
	// Steps is H, the optimizer steps between two averages (at least 1). Steps counts optimizer steps,
	// not micro-batches: with K-step accumulation an average follows every H·K micro-batches.
	Steps int
	// Outer, when set, makes it DiLoCo.
	Outer *OuterSGD
}

// OuterSGD is DiLoCo's outer optimizer: SGD with Nesterov momentum, as torch.optim.SGD(nesterov=True)
// computes it: v ← μ·v + Δ, θ_outer ← θ_outer − lr·(Δ + μ·v).
type OuterSGD struct {
	LearningRate float64
	Momentum     float64
}

// DiLoCo's defaults, from the DiLoCo paper (Douillard et al., 2023).
const (
	DefaultOuterLearningRate = 0.7
	DefaultOuterMomentum     = 0.9
)

// Validate checks the configuration.
func (l *LocalSGD) Validate() error {
	if l.Steps < 1 {
		return fmt.Errorf("prepare: %s needs at least 1 optimizer step between averages, got %d", l.kind(), l.Steps)
	}
	if o := l.Outer; o != nil {
		if !(o.LearningRate > 0) || math.IsInf(o.LearningRate, 0) {
			return fmt.Errorf("prepare: DiLoCo's outer learning rate must be a positive number, got %g", o.LearningRate)
		}
		if !(o.Momentum >= 0 && o.Momentum < 1) {
			return fmt.Errorf("prepare: DiLoCo's outer momentum must be in [0, 1), got %g", o.Momentum)
		}
	}
	return nil
}

func (l *LocalSGD) kind() string {
	if l.Outer != nil {
		return "DiLoCo"
	}
	return "local SGD"
}

// String names the mode and its settings: "local SGD (H=8)", "DiLoCo (H=8, outer lr 0.7, momentum 0.9)".
func (l *LocalSGD) String() string {
	if l == nil {
		return "synchronous"
	}
	if l.Outer != nil {
		return fmt.Sprintf("DiLoCo (H=%d, outer lr %g, momentum %g)", l.Steps, l.Outer.LearningRate, l.Outer.Momentum)
	}
	return fmt.Sprintf("local SGD (H=%d)", l.Steps)
}

// localState is an optimizer's part of local SGD: where it is in the period, and DiLoCo's outer state.
type localState struct {
	cfg LocalSGD
	// since is the optimizer steps (applied or skipped) since the last average.
	since    int
	averages int64
	// staging holds each bucket's parameters packed end to end, the buffer the all-reduce sums in place;
	// outer and momentum are DiLoCo's θ_outer and v in the same layout. Each is a []float32 or []float64.
	staging, outer, momentum []any
}

// LocalSGD is the local SGD configuration this optimizer trains with (nil: synchronous training).
func (o *Optimizer) LocalSGD() *LocalSGD {
	if o.local == nil {
		return nil
	}
	cfg := o.local.cfg
	return &cfg
}

// LocalStepsSinceAverage is the number of optimizer steps this process took on its own gradients since
// the parameters were last averaged (always 0 without local SGD): 0 right after an average, when every
// process holds the same parameters.
func (o *Optimizer) LocalStepsSinceAverage() int {
	if o.local == nil {
		return 0
	}
	return o.local.since
}

// ParameterAverages is the number of times local SGD averaged the parameters.
func (o *Optimizer) ParameterAverages() int64 {
	if o.local == nil {
		return 0
	}
	return o.local.averages
}

// LocalSGDState is what a checkpoint keeps of an optimizer's local SGD, beside every process's variables.
type LocalSGDState struct {
	// Since is LocalStepsSinceAverage.
	Since int
	// Outer and Momentum are DiLoCo's θ_outer and outer momentum, the raw little-endian bytes of each bucket
	// of the model's plan, identical on every process; nil for local SGD and before DiLoCo's first step.
	Outer, Momentum [][]byte
}

// LocalSGDState returns the optimizer's local SGD state for a checkpoint.
func (o *Optimizer) LocalSGDState() LocalSGDState {
	if o.local == nil {
		return LocalSGDState{}
	}
	s := LocalSGDState{Since: o.local.since}
	if o.local.outer != nil {
		for b := range o.local.outer {
			s.Outer = append(s.Outer, littleEndianBytes(o.local.outer[b]))
			s.Momentum = append(s.Momentum, littleEndianBytes(o.local.momentum[b]))
		}
	}
	return s
}

// ErrInsidePeriod is the error of a checkpoint taken between two averages of local SGD that a run cannot
// continue (another number of processes, another period or mode): the processes' parameters differ there.
var ErrInsidePeriod = errors.New("the checkpoint was taken between two parameter averages of local SGD")

// RestoreLocalSGD sets the optimizer's local SGD state from a checkpoint. Without outer state a DiLoCo
// optimizer takes θ_outer from the parameters at its next step, which is right only at a period's start
// (Since 0), where every process holds θ_outer.
func (o *Optimizer) RestoreLocalSGD(s LocalSGDState) error {
	outer, momentum, err := o.parseLocalSGD(s)
	if err != nil || o.local == nil {
		return err
	}
	o.local.since, o.local.outer, o.local.momentum = s.Since, outer, momentum
	return nil
}

// CheckLocalSGD returns the error RestoreLocalSGD would return for s, without changing anything.
func (o *Optimizer) CheckLocalSGD(s LocalSGDState) error {
	_, _, err := o.parseLocalSGD(s)
	return err
}

func (o *Optimizer) parseLocalSGD(s LocalSGDState) (outer, momentum []any, err error) {
	l := o.local
	if l == nil {
		if s.Since != 0 || s.Outer != nil {
			return nil, nil, errors.New("prepare: local SGD state restored into an optimizer that trains synchronously")
		}
		return nil, nil, nil
	}
	if s.Since < 0 || s.Since >= l.cfg.Steps {
		return nil, nil, fmt.Errorf("prepare: %d local steps since the last average, outside a period of %d", s.Since,
			l.cfg.Steps)
	}
	if l.cfg.Outer != nil && s.Outer == nil && s.Since != 0 {
		return nil, nil, fmt.Errorf("prepare: DiLoCo state %d steps into a period has no outer parameters", s.Since)
	}
	if s.Outer != nil {
		if l.cfg.Outer == nil {
			return nil, nil, errors.New("prepare: DiLoCo's outer state restored into local SGD")
		}
		buckets := o.model.plan.Buckets
		if len(s.Outer) != len(buckets) || len(s.Momentum) != len(buckets) {
			return nil, nil, fmt.Errorf("prepare: DiLoCo state for %d and %d buckets, the plan has %d", len(s.Outer),
				len(s.Momentum), len(buckets))
		}
		for b, bucket := range buckets {
			if len(s.Outer[b]) != bucket.Bytes() || len(s.Momentum[b]) != bucket.Bytes() {
				return nil, nil, fmt.Errorf("prepare: DiLoCo state of bucket %d has %d and %d bytes, the bucket %d",
					b, len(s.Outer[b]), len(s.Momentum[b]), bucket.Bytes())
			}
			outer = append(outer, flatFromBytes(bucket.DType, s.Outer[b]))
			momentum = append(momentum, flatFromBytes(bucket.DType, s.Momentum[b]))
		}
	}
	return outer, momentum, nil
}

// beginLocalStep runs before each local step is applied: DiLoCo's θ_outer is the parameters as of the
// period's start, which every process holds before its first step.
func (o *Optimizer) beginLocalStep() error {
	l := o.local
	if l.cfg.Outer == nil || l.outer != nil {
		return nil
	}
	if l.since != 0 {
		return fmt.Errorf("prepare: DiLoCo has no outer parameters %d steps into a period", l.since)
	}
	if err := o.packParameters(); err != nil {
		return err
	}
	l.outer, l.momentum = make([]any, len(l.staging)), make([]any, len(l.staging))
	for b, flat := range l.staging {
		l.outer[b] = cloneFlat(flat)
		l.momentum[b] = zerosLike(flat)
	}
	return nil
}

// endLocalStep counts a local step (applied, or skipped for non-finite gradients: every process counts
// the same steps, whatever each decided) and averages at the end of a period.
func (o *Optimizer) endLocalStep() error {
	l := o.local
	l.since++
	if l.since < l.cfg.Steps {
		return nil
	}
	if err := o.averageParameters(); err != nil {
		return fmt.Errorf("prepare: %s: averaging the parameters after optimizer step %d: %w", &l.cfg,
			o.steps+o.skippedSteps, err)
	}
	l.since = 0
	l.averages++
	return nil
}

// averageParameters all-reduces every bucket of parameters (one collective per bucket of the gradient
// plan, started together), divides by the number of processes, applies DiLoCo's outer step, sets every
// parameter to the result and averages the buffers. Collective.
func (o *Optimizer) averageParameters() error {
	m, l := o.model, o.local
	if err := o.packParameters(); err != nil {
		return err
	}
	comm := m.rt.Comm
	if comm.Size() > 1 {
		pending := make([]*backends.Pending, 0, len(l.staging))
		var firstErr error
		for b, flat := range l.staging {
			buf, err := backends.Elements(flat)
			if err == nil {
				var p *backends.Pending
				if p, err = comm.AllReduceSumAsync(buf); err == nil {
					pending = append(pending, p)
				}
			}
			if err != nil {
				firstErr = fmt.Errorf("bucket %d: %w", b, err)
				break
			}
		}
		for _, p := range pending {
			if err := p.Wait(); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		runtime.KeepAlive(l.staging)
		if firstErr != nil {
			return firstErr
		}
	}
	n := comm.Size()
	for b, flat := range l.staging {
		var outer, momentum any
		if l.outer != nil {
			outer, momentum = l.outer[b], l.momentum[b]
		}
		switch sum := flat.(type) {
		case []float32:
			outerStep(sum, asFlat[float32](outer), asFlat[float32](momentum), n, l.cfg.Outer)
		case []float64:
			outerStep(sum, asFlat[float64](outer), asFlat[float64](momentum), n, l.cfg.Outer)
		}
	}
	if err := o.unpackParameters(); err != nil {
		return err
	}
	// Buffers part with the parameters between averages (no gradient reaches them): the mean is the
	// statistics of every process's examples, as AverageBuffers gives synchronous training.
	return m.SyncBuffers(AverageBuffers)
}

func asFlat[F floats.Float](flat any) []F {
	if flat == nil {
		return nil
	}
	return flat.([]F)
}

// outerStep turns sum, the processes' parameters summed, into what every process continues from: their
// mean, or for DiLoCo (outer non-nil) θ_outer after an outer Nesterov step on Δ = θ_outer − mean.
func outerStep[F floats.Float](sum, outer, momentum []F, n int, cfg *OuterSGD) {
	size := F(n)
	if cfg == nil {
		for i := range sum {
			sum[i] /= size
		}
		return
	}
	lr, mu := F(cfg.LearningRate), F(cfg.Momentum)
	for i := range sum {
		delta := outer[i] - sum[i]/size
		momentum[i] = mu*momentum[i] + delta
		outer[i] -= lr * (delta + mu*momentum[i])
		sum[i] = outer[i]
	}
}

// packParameters copies every parameter into its slot of the staging buckets.
func (o *Optimizer) packParameters() error {
	m, l := o.model, o.local
	if l.staging == nil {
		l.staging = make([]any, len(m.plan.Buckets))
		for b, bucket := range m.plan.Buckets {
			switch bucket.DType {
			case dtypes.Float32:
				l.staging[b] = make([]float32, bucket.Size)
			case dtypes.Float64:
				l.staging[b] = make([]float64, bucket.Size)
			default:
				return fmt.Errorf("bucket %d holds %s parameters, which cannot be averaged", b, bucket.DType)
			}
		}
	}
	for b, bucket := range m.plan.Buckets {
		for _, slot := range bucket.Slots {
			v := m.params[slot.Param]
			t, err := v.Value()
			if err == nil {
				err = t.ConstFlatData(func(flat any) { copyFlat(l.staging[b], slot.Offset, flat) })
			}
			if err != nil {
				return fmt.Errorf("parameter %q: %w", v.ScopeAndName(), err)
			}
		}
	}
	return nil
}

// unpackParameters sets every parameter to its slot of the staging buckets.
func (o *Optimizer) unpackParameters() error {
	m, l := o.model, o.local
	for b, bucket := range m.plan.Buckets {
		for _, slot := range bucket.Slots {
			v := m.params[slot.Param]
			var t *tensors.Tensor
			switch flat := l.staging[b].(type) {
			case []float32:
				t = tensors.FromFlatDataAndDimensions(cloneFlat(flat[slot.Offset:slot.Offset+slot.Size]).([]float32),
					v.Shape().Dimensions...)
			case []float64:
				t = tensors.FromFlatDataAndDimensions(cloneFlat(flat[slot.Offset:slot.Offset+slot.Size]).([]float64),
					v.Shape().Dimensions...)
			}
			if err := v.SetValue(t); err != nil {
				return fmt.Errorf("parameter %q: %w", v.ScopeAndName(), err)
			}
		}
	}
	return nil
}

func copyFlat(dst any, offset int, src any) {
	switch d := dst.(type) {
	case []float32:
		copy(d[offset:], src.([]float32))
	case []float64:
		copy(d[offset:], src.([]float64))
	}
}

func cloneFlat(flat any) any {
	switch f := flat.(type) {
	case []float32:
		return append([]float32(nil), f...)
	case []float64:
		return append([]float64(nil), f...)
	}
	panic(fmt.Sprintf("local SGD: flat data of %T", flat))
}

func zerosLike(flat any) any {
	switch f := flat.(type) {
	case []float32:
		return make([]float32, len(f))
	case []float64:
		return make([]float64, len(f))
	}
	panic(fmt.Sprintf("local SGD: flat data of %T", flat))
}

// littleEndianBytes is flat's little-endian bytes.
func littleEndianBytes(flat any) []byte {
	switch f := flat.(type) {
	case []float32:
		out := make([]byte, 0, 4*len(f))
		for _, x := range f {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(x))
		}
		return out
	case []float64:
		out := make([]byte, 0, 8*len(f))
		for _, x := range f {
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(x))
		}
		return out
	}
	panic(fmt.Sprintf("local SGD: flat data of %T", flat))
}

// flatFromBytes reads littleEndianBytes' output back (the length was checked against the bucket).
func flatFromBytes(dt dtypes.DType, data []byte) any {
	if dt == dtypes.Float64 {
		f := make([]float64, len(data)/8)
		for i := range f {
			f[i] = math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:]))
		}
		return f
	}
	f := make([]float32, len(data)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return f
}
