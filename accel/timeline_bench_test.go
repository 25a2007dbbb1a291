package accel_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// BenchmarkTimelineOverhead trains the test MLP on one process with the timeline off and on, one optimizer
// step of each in turn (so that both see the same machine load), and reports each one's time per step and
// their ratio. The MLP's steps are short, which makes the recorder's share the largest it gets.
func BenchmarkTimelineOverhead(b *testing.B) {
	type trainer struct {
		acc   *accel.Accelerator
		model *prepare.Model
		opt   *prepare.Optimizer
		spent time.Duration
	}
	inputs, labels := testmodel.Data(64, 9)
	batch := batchOf(inputs, labels)
	newTrainer := func(opts ...accel.Option) *trainer {
		acc, err := accel.New(append([]accel.Option{accel.WithBackend("go")}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
		if err != nil {
			b.Fatal(err)
		}
		opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
		if err != nil {
			b.Fatal(err)
		}
		return &trainer{acc: acc, model: model, opt: opt}
	}
	step := func(tr *trainer) {
		start := time.Now()
		if _, err := tr.acc.Backward(tr.model, batch); err != nil {
			b.Fatal(err)
		}
		if _, err := tr.opt.Step(); err != nil {
			b.Fatal(err)
		}
		tr.spent += time.Since(start)
	}
	off := newTrainer()
	on := newTrainer(accel.WithTimeline(filepath.Join(b.TempDir(), "timeline.json")))
	for range 20 { // compile and warm up
		step(off)
		step(on)
	}
	off.spent, on.spent = 0, 0
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			step(off)
			step(on)
		} else {
			step(on)
			step(off)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(off.spent.Nanoseconds())/float64(b.N), "ns/step-off")
	b.ReportMetric(float64(on.spent.Nanoseconds())/float64(b.N), "ns/step-on")
	b.ReportMetric(float64(on.spent)/float64(off.spent), "on/off")
	_ = off.acc.Close()
	_ = on.acc.Close()
}
