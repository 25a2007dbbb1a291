// Package schedule provides learning-rate schedules sized by the job they run in: warm-up followed by
// cosine or linear decay over the whole job, whose length is known only once the data loaders are prepared
// (it depends on the dataset, the batch size, the number of processes and the gradient accumulation
// steps). A Sized schedule takes that length and returns the prepare.Schedule an optimizer's Scheduler
// follows; accel.Spec.SizedSchedule (with Spec.Epochs) sizes it for you.
//
// The curves are those of Hugging Face transformers' get_cosine_schedule_with_warmup and
// get_linear_schedule_with_warmup: during warm-up the rate of optimizer step s (counted from 0) is
// peak·s/warmup, so the first step's rate is 0; then it decays to the minimum rate (default 0) at the last
// step.
//
// A schedule can be sized in optimizer steps (the job's total steps; the schedule takes a step number) or
// in examples (InExamples: the job's total examples; the schedule takes the number of the job's examples
// seen before a step). In examples the curve is a function of the share of the job done, so a job resumed
// with another global batch — on another number of processes — carries on where that share says, where a
// schedule sized in steps would count the new run's steps against the old run's total. accel.Prepare
// sizes a Spec's schedule in examples.
package schedule

import (
	"math"

	"github.com/goaccel/goaccel/prepare"
)

// Sized is a schedule whose shape depends on the job's length. Called with the job's total number of
// optimizer steps, it returns the rate of each optimizer step (counted from 0). Called with
// InExamples(perStep), total is the job's number of examples and the schedule it returns takes the number
// of the job's examples seen before a step instead of a step number.
//
// A Sized that only knows optimizer steps can be made one with FromSteps.
type Sized func(total int64, opts ...SizeOption) prepare.Schedule

// SizeOption says how a Sized schedule is sized.
type SizeOption func(*sizing)

type sizing struct {
	// perStep is the number of examples per optimizer step when sized in examples, 0 in steps.
	perStep int64
}

// InExamples sizes a schedule in examples: the total it is given is the job's number of examples, and the
// schedule it returns takes the number of examples the job had seen before an optimizer step. perStep is
// the number of examples of one optimizer step of this run (processes × K × batch size): a warm-up given in
// optimizer steps lasts that many examples per step (a warm-up given with WarmupRatio needs no such
// conversion). accel.Prepare sizes a Spec's schedule this way.
func InExamples(perStep int64) SizeOption {
	return func(s *sizing) { s.perStep = max(perStep, 1) }
}

// Option configures a schedule.
type Option func(*curve)

// MinRate is the rate the decay ends at, an absolute learning rate (default 0).
func MinRate(rate float64) Option { return func(c *curve) { c.min = rate } }

// WarmupRatio makes the warm-up a share of the job, from 0 to 1, instead of a number of optimizer steps
// (the warmupSteps given to Cosine or Linear are then ignored): Hugging Face's warmup_ratio, except that
// the share is not rounded up to whole steps. A job whose global batch changes on a resume keeps the
// same curve with it — the warm-up covers the same examples whatever the number of processes — where a
// warm-up in steps covers the steps of the run that takes them (see InExamples).
func WarmupRatio(ratio float64) Option {
	return func(c *curve) { c.ratio, c.byRatio = min(max(ratio, 0), 1), true }
}

type curve struct {
	peak, min float64
	warmup    int64   // optimizer steps
	ratio     float64 // the warm-up's share of the job, with byRatio
	byRatio   bool
	// decay falls from 1 at the start of the decay (p = 0) to 0 at its end (p = 1).
	decay func(p float64) float64
}

// Cosine warms up linearly from 0 to peak over warmupSteps optimizer steps, then follows half a cosine
// from peak down to the minimum rate at the last step.
func Cosine(peak float64, warmupSteps int64, opts ...Option) Sized {
	return newCurve(peak, warmupSteps, opts, func(p float64) float64 { return 0.5 * (1 + math.Cos(math.Pi*p)) }).sized
}

// Linear warms up linearly from 0 to peak over warmupSteps optimizer steps, then decreases linearly to the
// minimum rate at the last step.
func Linear(peak float64, warmupSteps int64, opts ...Option) Sized {
	return newCurve(peak, warmupSteps, opts, func(p float64) float64 { return 1 - p }).sized
}

// FromSteps makes a Sized of a schedule that only knows optimizer steps, for one written before schedules
// could be sized in examples. Sized in examples, it is sized with the job's examples over the examples per
// step, rounded up, and given the examples seen over the examples per step, rounded down: the same steps
// as a run that never changed its global batch, approximately the same after a change.
func FromSteps(sized func(totalSteps int64) prepare.Schedule) Sized {
	return func(total int64, opts ...SizeOption) prepare.Schedule {
		s := sizingOf(opts)
		if s.perStep == 0 {
			return sized(total)
		}
		steps := sized((total + s.perStep - 1) / s.perStep)
		return func(seen int64) float64 { return steps(seen / s.perStep) }
	}
}

func newCurve(peak float64, warmup int64, opts []Option, decay func(float64) float64) curve {
	c := curve{peak: peak, warmup: max(warmup, 0), decay: decay}
	for _, opt := range opts {
		opt(&c)
	}
	return c
}

func sizingOf(opts []SizeOption) sizing {
	var s sizing
	for _, opt := range opts {
		opt(&s)
	}
	return s
}

// sized is the curve's Sized: the position (a step or the examples seen) and the total are in the same
// unit, and so is the warm-up's length.
func (c curve) sized(total int64, opts ...SizeOption) prepare.Schedule {
	perStep := max(sizingOf(opts).perStep, 1)
	warmup := float64(c.warmup * perStep)
	if c.byRatio {
		warmup = c.ratio * float64(total)
	}
	return func(position int64) float64 { return c.at(float64(position), warmup, float64(total)) }
}

// at is the rate at position, with a warm-up of warmup and a job of total (in one unit).
func (c curve) at(position, warmup, total float64) float64 {
	if position < warmup {
		return c.peak * position / warmup
	}
	p := 1.0
	if span := total - warmup; span > 0 {
		p = min((position-warmup)/span, 1)
	}
	return c.min + (c.peak-c.min)*c.decay(p)
}
