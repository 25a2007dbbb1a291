// Package schedule provides learning-rate schedules sized by the job they run in: warm-up followed by
// cosine or linear decay over the job's total number of optimizer steps, which is known only once the
// data loaders are prepared (it depends on the dataset, the batch size, the number of processes and the
// gradient accumulation steps). A Sized schedule takes that total and returns the prepare.Schedule an
// optimizer's Scheduler follows; accel.Spec.SizedSchedule (with Spec.Epochs) computes the total for you.
//
// The curves are those of Hugging Face transformers' get_cosine_schedule_with_warmup and
// get_linear_schedule_with_warmup: during warm-up the rate of optimizer step s (counted from 0) is
// peak·s/warmup, so the first step's rate is 0; then it decays to the minimum rate (default 0) at the last
// step.
package schedule

import (
	"math"

	"github.com/goaccel/goaccel/prepare"
)

// Sized is a schedule whose shape depends on the job's total number of optimizer steps.
type Sized func(totalSteps int64) prepare.Schedule

// Option configures a schedule.
type Option func(*curve)

// MinRate is the rate the decay ends at, an absolute learning rate (default 0).
func MinRate(rate float64) Option { return func(c *curve) { c.min = rate } }

type curve struct {
	peak, min float64
	warmup    int64
}

// Cosine warms up linearly from 0 to peak over warmupSteps optimizer steps, then follows half a cosine
// from peak down to the minimum rate at the last step.
func Cosine(peak float64, warmupSteps int64, opts ...Option) Sized {
	c := newCurve(peak, warmupSteps, opts)
	return func(total int64) prepare.Schedule {
		return func(step int64) float64 {
			if rate, warming := c.warmingUp(step); warming {
				return rate
			}
			return c.min + (c.peak-c.min)*0.5*(1+math.Cos(math.Pi*c.progress(step, total)))
		}
	}
}

// Linear warms up linearly from 0 to peak over warmupSteps optimizer steps, then decreases linearly to the
// minimum rate at the last step.
func Linear(peak float64, warmupSteps int64, opts ...Option) Sized {
	c := newCurve(peak, warmupSteps, opts)
	return func(total int64) prepare.Schedule {
		return func(step int64) float64 {
			if rate, warming := c.warmingUp(step); warming {
				return rate
			}
			return c.min + (c.peak-c.min)*(1-c.progress(step, total))
		}
	}
}

func newCurve(peak float64, warmup int64, opts []Option) curve {
	c := curve{peak: peak, warmup: max(warmup, 0)}
	for _, opt := range opts {
		opt(&c)
	}
	return c
}

// warmingUp is the warm-up rate of step, while step < warmup.
func (c curve) warmingUp(step int64) (float64, bool) {
	if step >= c.warmup {
		return 0, false
	}
	return c.peak * float64(step) / float64(c.warmup), true
}

// progress is how far step is into the decay, from 0 at the end of warm-up to 1 at total (and beyond).
func (c curve) progress(step, total int64) float64 {
	span := total - c.warmup
	if span <= 0 {
		return 1
	}
	return min(float64(step-c.warmup)/float64(span), 1)
}
