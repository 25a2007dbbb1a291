package bench

import (
	"fmt"
	"runtime"

	"github.com/goaccel/goaccel/backends"
)

// AllReduceResult compares goaccel's all-reduce with plain MPI on one buffer size and world size.
type AllReduceResult struct {
	Ranks int   `json:"ranks"`
	Bytes int64 `json:"bytes"`
	// Raw is the reference (blocking MPI_Allreduce in C), Goaccel is Communicator.AllReduceSum.
	Raw     Series `json:"raw"`
	Goaccel Series `json:"goaccel"`
	// IallreduceWait is a diagnostic: the non-blocking collective goaccel's engine starts, completed by
	// MPI_Wait in C. Against Raw it prices MPI's choice of algorithm for MPI_Iallreduce; against Goaccel,
	// everything goaccel adds on top (the Go side and the Communicator's wait loop).
	IallreduceWait Series `json:"iallreduce_wait"`
	// IallreduceTest completes the same collective by polling MPI_Test in a C loop. Against Goaccel it
	// prices the Go side of polling: a cgo call, the scheduler and locks per MPI_Test.
	IallreduceTest Series `json:"iallreduce_test"`
	// EngineSpin and EngineYield are diagnostics of the wait loop: goaccel's mpi engine driven from Go as
	// the Communicator drives it, but polling Test without ever sleeping, with runtime.Gosched (EngineSpin)
	// or with the sched_yield system call (EngineYield, which lets co-located ranks run) between polls.
	EngineSpin  Series `json:"engine_spin"`
	EngineYield Series `json:"engine_yield"`
}

// BusFactor converts algorithm bandwidth into bus bandwidth for an all-reduce over n ranks: each rank
// sends and receives 2(n−1)/n of the buffer in a bandwidth-optimal algorithm (as in nccl-tests).
func BusFactor(n int) float64 { return 2 * float64(n-1) / float64(n) }

// MeasureAllReduce times, for each size, goaccel's Communicator.AllReduceSum against plain MPI loops on the
// same float32 buffer in the same processes. Collective: every rank calls it with the same arguments.
//
// engine, when not nil, is a second engine of the same kind as comm's, driven directly for the EngineSpin
// diagnostic.
func MeasureAllReduce(comm *backends.Communicator, raw RawMPI, engine backends.Engine, sizes []int64, t Timing) ([]AllReduceResult, error) {
	g := Group{Comm: comm, Barrier: raw.barrier, Timing: t}
	var out []AllReduceResult
	for _, size := range sizes {
		buf := make([]float32, size/4)
		name := func(impl string) string {
			return fmt.Sprintf("AllReduce/impl=%s/size=%s/ranks=%d", impl, formatBytes(size), comm.Size())
		}
		rawLoop := func(kind RawKind) func(int) error {
			return func(iters int) error { return raw.run(kind, buf, iters) }
		}
		variants := []Variant{
			{Name: name("mpi"), Run: rawLoop(RawAllreduce)},
			{Name: name("goaccel"), Run: func(iters int) error {
				for range iters {
					if err := comm.AllReduceSum(buf); err != nil {
						return err
					}
				}
				return nil
			}},
			{Name: name("mpi-iallreduce-wait"), Run: rawLoop(RawIallreduceWait)},
			{Name: name("mpi-iallreduce-test"), Run: rawLoop(RawIallreduceTest)},
		}
		if engine != nil {
			variants = append(variants, Variant{Name: name("engine-spin"), Run: func(iters int) error {
				for range iters {
					if err := spinAllReduce(engine, buf, runtime.Gosched); err != nil {
						return err
					}
				}
				return nil
			}}, Variant{Name: name("engine-yield"), Run: func(iters int) error {
				for range iters {
					if err := spinAllReduce(engine, buf, schedYield); err != nil {
						return err
					}
				}
				return nil
			}})
		}
		series, err := g.Measure(variants...)
		if err != nil {
			return nil, fmt.Errorf("all-reduce of %s: %w", formatBytes(size), err)
		}
		for i := range series {
			series[i].Bytes = size
		}
		r := AllReduceResult{Ranks: comm.Size(), Bytes: size, Raw: series[0], Goaccel: series[1],
			IallreduceWait: series[2], IallreduceTest: series[3]}
		if engine != nil {
			r.EngineSpin, r.EngineYield = series[4], series[5]
		}
		out = append(out, r)
	}
	return out, nil
}

// spinAllReduce is Communicator.AllReduceSum without the back-off: it polls the engine's request until it
// completes, yielding the processor to other goroutines between polls but never sleeping.
func spinAllReduce(engine backends.Engine, buf []float32, pause func()) error {
	req, err := engine.StartAllReduceSum(buf)
	if err != nil {
		return err
	}
	for {
		done, err := req.Test()
		if done || err != nil {
			return err
		}
		pause()
	}
}
