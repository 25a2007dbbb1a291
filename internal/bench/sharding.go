package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"time"

	gomlxcontext "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// shardingPlan is the ZeRO measurement: a model of tens of millions of parameters trained with Adam under
// each sharding strategy on each process count, every configuration a fresh mpirun job, so that the peak
// memory of its processes is that configuration's alone.
type shardingPlan struct {
	Config trainConfig // K must be 1: ShardGradients drops the whole-model accumulator only then
	// Procs are the process counts; on 1 process only Replicated runs (every strategy runs replicated there).
	Procs      []int
	Strategies []string // names accumulate.ParseSharding reads; the first is the reference, "replicated"
	Rounds     int      // jobs per configuration, interleaved (0: skip the section)
	// Warmup steps compile the graphs and touch every buffer; Steps are then timed one by one.
	Warmup, Steps int
}

// configs are the plan's (processes, strategy) pairs, in the report's order.
func (p shardingPlan) configs() [][2]string {
	var out [][2]string
	for _, n := range p.Procs {
		for i, s := range p.Strategies {
			if n == 1 && i > 0 {
				break
			}
			out = append(out, [2]string{strconv.Itoa(n), s})
		}
	}
	return out
}

// shardingJob is what the driver hands the ranks of one sharding job.
type shardingJob struct {
	Plan     shardingPlan
	Strategy string
}

// shardingResult is one configuration over every round.
type shardingResult struct {
	Strategy string
	Procs    int
	// Params and Buckets describe the model's gradient plan; MomentVars counts the optimizer's variables
	// whose name ends in "_moment" on one process (2 per parameter for Adam replicated, 2 per bucket sharded).
	Params          int64
	Buckets         int
	MomentVars      int
	PeakRSS         []int64 // per rank: VmHWM at the end of the job, the largest over the rounds
	LiveHeap        []int64 // per rank: Go's heap in use after a final collection (what the peak could shrink to)
	OptimizerState  []int64 // per rank: bytes of the variables whose name ends in "_moment"
	Step            series  // one sample per timed step: Backward + Step + ZeroGrad, the slowest rank's
	Backward        series  // the forward and backward pass with the gradient sync it ends with
	Update          series  // Step and ZeroGrad: the optimizer's update (and, sharded, the all-gather)
	PerStep         shardingBreakdown
	Err             string `json:",omitempty"`
	roundsBreakdown int    // rounds merged into PerStep so far
}

// shardingBreakdown is where a step's time goes, seconds per step: the slowest rank's, the mean over the
// rounds. The waits are the communicator's: time spent blocked on each collective.
type shardingBreakdown struct {
	AllReduceWait, ReduceScatterWait, AllGatherWait float64
	// ModelCompute is the compiled forward and backward pass; OptimizerCompute the whole optimizer step as
	// goaccel counts it (sharded: refreshing the parameter blocks, the update and the all-gather).
	ModelCompute, OptimizerCompute float64
}

// commWait is what a step spends in collectives, whichever the strategy uses.
func (b shardingBreakdown) commWait() float64 {
	return b.AllReduceWait + b.ReduceScatterWait + b.AllGatherWait
}

// maxOf is the largest of xs (0 for none).
func maxOf(xs []int64) int64 {
	var m int64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// measureSharding runs every configuration's job once per round, in an order that changes from round to
// round, and merges the rounds.
func (d *driver) measureSharding(ctx context.Context) ([]shardingResult, error) {
	p := d.plan.Sharding
	if p.Rounds == 0 {
		return nil, nil
	}
	configs := p.configs()
	out := make([]shardingResult, len(configs))
	for i, c := range configs {
		n, _ := strconv.Atoi(c[0])
		name := fmt.Sprintf("ShardingStep/model=%s/strategy=%s/procs=%d", p.Config.Name, c[1], n)
		out[i] = shardingResult{Strategy: c[1], Procs: n, Step: series{Name: name, Iters: 1},
			Backward: series{Name: name + "/backward", Iters: 1}, Update: series{Name: name + "/update", Iters: 1}}
	}
	for round := range p.Rounds {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0x5a4d)).Perm(len(out)) {
			r := &out[i]
			if r.Err != "" {
				continue
			}
			d.progressf("sharding: %s, %s on %s (round %d of %d)\n", p.Config.Model.shortName(), r.Strategy,
				processes(r.Procs), round+1, p.Rounds)
			// Always on this machine, -hosts or not: the processes' memory is what is compared, and on
			// one machine they all answer to the same memory and Go runtime.
			got, err := d.runRanks(ctx, r.Procs, nil, rankJob{Sharding: &shardingJob{Plan: p, Strategy: r.Strategy}})
			if err != nil {
				// A configuration that cannot run (out of memory, say) must not cost the others.
				d.progressf("sharding: %s on %s: %v\n", r.Strategy, processes(r.Procs), err)
				r.Err = firstLine(err.Error())
				continue
			}
			if len(got.Sharding) != 1 {
				return nil, fmt.Errorf("sharding: a job returned %d results", len(got.Sharding))
			}
			r.merge(got.Sharding[0])
		}
	}
	for _, r := range out {
		d.emit(r.Step)
	}
	return out, nil
}

// merge adds one round's job to r.
func (r *shardingResult) merge(job shardingResult) {
	r.Params, r.Buckets, r.MomentVars, r.OptimizerState = job.Params, job.Buckets, job.MomentVars, job.OptimizerState
	if len(r.PeakRSS) == 0 {
		r.PeakRSS, r.LiveHeap = make([]int64, len(job.PeakRSS)), make([]int64, len(job.LiveHeap))
	}
	for i := range job.PeakRSS {
		r.PeakRSS[i] = max(r.PeakRSS[i], job.PeakRSS[i])
		r.LiveHeap[i] = max(r.LiveHeap[i], job.LiveHeap[i])
	}
	r.Step.Seconds = append(r.Step.Seconds, job.Step.Seconds...)
	r.Backward.Seconds = append(r.Backward.Seconds, job.Backward.Seconds...)
	r.Update.Seconds = append(r.Update.Seconds, job.Update.Seconds...)
	// A running mean over the rounds.
	n := float64(r.roundsBreakdown)
	mean := func(acc *float64, x float64) { *acc = (*acc*n + x) / (n + 1) }
	b, j := &r.PerStep, job.PerStep
	mean(&b.AllReduceWait, j.AllReduceWait)
	mean(&b.ReduceScatterWait, j.ReduceScatterWait)
	mean(&b.AllGatherWait, j.AllGatherWait)
	mean(&b.ModelCompute, j.ModelCompute)
	mean(&b.OptimizerCompute, j.OptimizerCompute)
	r.roundsBreakdown++
}

// newAdam is the sharding section's optimizer: Adam, whose two moments per parameter are the state ZeRO
// splits.
func newAdam() optimizers.Interface { return optimizers.Adam().LearningRate(1e-4).Done() }

// runShardingRank is one rank of a sharding job. It goes through the Accelerator as a training program
// does: the Accelerator opens the communicator itself (the single engine on one process), so that
// nothing the benchmark holds adds to the memory measured. Rank 0 writes the results.
func runShardingRank(job shardingJob, stdout, w io.Writer) (err error) {
	sharding, err := accumulate.ParseSharding(job.Strategy)
	if err != nil {
		return err
	}
	cfg := job.Plan.Config
	acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(cfg.K),
		accel.WithSharding(sharding), accel.WithOutput(io.Discard), accel.WithCollectiveTimeout(5*time.Minute))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			fmt.Fprintf(w, "accelbench: rank %d of %d: %v\n", acc.Rank(), acc.WorldSize(), err)
			acc.Communicator().Abort(1) // the other ranks must not wait for this one until the timeout
		}
		err = errors.Join(err, acc.Close())
	}()
	model, err := acc.PrepareModel(gomlxcontext.New(), cfg.Model.modelFn, loss)
	if err != nil {
		return err
	}
	opt, err := acc.PrepareOptimizer(model, newAdam())
	if err != nil {
		return err
	}
	batches := cfg.Model.batches(2, cfg.Batch, uint64(acc.Rank()+1))
	if err := model.Materialize(batches[0]); err != nil {
		return err
	}
	next := 0
	var backward, update time.Duration
	step := func() error {
		batch := batches[next%len(batches)]
		next++
		return acc.Accumulate(func() error {
			start := time.Now()
			if _, err := acc.Backward(model, batch); err != nil {
				return err
			}
			mid := time.Now()
			if _, err := opt.Step(); err != nil {
				return err
			}
			err := opt.ZeroGrad()
			backward, update = mid.Sub(start), time.Since(mid)
			return err
		})
	}
	for range job.Plan.Warmup {
		if err := step(); err != nil {
			return err
		}
	}
	steps := max(job.Plan.Steps, 1)
	before, modelBefore, optBefore := acc.Stats(), model.ComputeTime(), opt.ComputeTime()
	var total, back, upd []float64
	for range steps {
		// Every rank starts the step together: a step's time is then its own, not the skew of the last. The
		// communicator's own barrier, not WaitForEveryone, which is an all-gather and would count as one.
		if err := acc.Communicator().Barrier(); err != nil {
			return err
		}
		start := time.Now()
		if err := step(); err != nil {
			return err
		}
		total = append(total, time.Since(start).Seconds())
		back, upd = append(back, backward.Seconds()), append(upd, update.Seconds())
	}
	after := acc.Stats()
	perStep := func(d time.Duration) float64 { return d.Seconds() / float64(steps) }
	wait := func(op backends.Op) float64 {
		return (after.Collectives.Of(op).Wait - before.Collectives.Of(op).Wait).Seconds() / float64(steps)
	}
	var momentVars int
	var state int64
	for v := range model.Context().IterVariables() {
		if strings.HasSuffix(v.Name(), "_moment") {
			momentVars++
			state += int64(v.Shape().Memory())
		}
	}
	peak, err := peakRSS()
	if err != nil {
		return err
	}
	runtime.GC()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	// One fixed-length vector per rank, gathered on every rank: the per-rank figures, the breakdown, then
	// each timed step's total, backward and update times.
	mine := []float64{float64(peak), float64(mem.HeapInuse), float64(state), float64(momentVars),
		wait(backends.OpAllReduce), wait(backends.OpReduceScatter), wait(backends.OpAllGather),
		perStep(model.ComputeTime() - modelBefore), perStep(opt.ComputeTime() - optBefore)}
	const fixed = 9
	mine = append(append(append(mine, total...), back...), upd...)
	size := acc.WorldSize()
	all := make([]float64, len(mine)*size)
	if err := acc.Communicator().AllGather(backends.BufferOf(mine), backends.BufferOf(all)); err != nil {
		return err
	}
	if acc.Rank() != 0 {
		return nil
	}
	plan := model.Plan()
	res := shardingResult{Strategy: sharding.Name(), Procs: size, Buckets: len(plan.Buckets), MomentVars: momentVars}
	for _, b := range plan.Buckets {
		res.Params += int64(b.Size)
	}
	res.Step.Seconds, res.Backward.Seconds, res.Update.Seconds = make([]float64, steps), make([]float64, steps),
		make([]float64, steps)
	for r := range size {
		v := all[r*len(mine) : (r+1)*len(mine)]
		res.PeakRSS = append(res.PeakRSS, int64(v[0]))
		res.LiveHeap = append(res.LiveHeap, int64(v[1]))
		res.OptimizerState = append(res.OptimizerState, int64(v[2]))
		b := &res.PerStep
		b.AllReduceWait, b.ReduceScatterWait = max(b.AllReduceWait, v[4]), max(b.ReduceScatterWait, v[5])
		b.AllGatherWait = max(b.AllGatherWait, v[6])
		b.ModelCompute, b.OptimizerCompute = max(b.ModelCompute, v[7]), max(b.OptimizerCompute, v[8])
		for i := range steps {
			res.Step.Seconds[i] = max(res.Step.Seconds[i], v[fixed+i])
			res.Backward.Seconds[i] = max(res.Backward.Seconds[i], v[fixed+steps+i])
			res.Update.Seconds[i] = max(res.Update.Seconds[i], v[fixed+2*steps+i])
		}
	}
	return writeResultsLine(stdout, 0, results{Sharding: []shardingResult{res}})
}

// peakRSS is this process's high-water resident set (VmHWM), in bytes. Not its rusage: Linux carries the
// parent's resident set over into the Maxrss of a child that Go starts with vfork and exec.
func peakRSS() (int64, error) {
	kb, err := strconv.ParseInt(strings.TrimSuffix(firstField("/proc/self/status", "VmHWM", ":"), " kB"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: reading the peak resident set: %w", err)
	}
	return kb << 10, nil
}
