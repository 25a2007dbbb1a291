package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/launch"
)

// RankJobFlag is the command-line flag with which the driver starts itself as the ranks of an mpirun
// job: `accelbench -rank-job FILE`, FILE holding a rankJob.
const RankJobFlag = "rank-job"

// RingAlgorithmEnv is the Open MPI MCA setting the what-if all-reduce run adds: libnbc's ring algorithm
// for MPI_Iallreduce.
const RingAlgorithmEnv = "OMPI_MCA_coll_libnbc_iallreduce_algorithm=1"

// Results is everything one run measured; the report is rendered from it.
type Results struct {
	Machine  Machine   `json:"machine"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Plan     Plan      `json:"plan"`

	// Shipped is goaccel as it is; WithFixes the what-if run (nil unless Plan.WhatIf).
	Shipped   Measurements     `json:"shipped"`
	WithFixes *Measurements    `json:"with_fixes,omitempty"`
	Overhead  []OverheadResult `json:"overhead"`
}

// Measurements are the multi-process measurements, for every world size.
type Measurements struct {
	AllReduce    []AllReduceResult    `json:"allreduce"`
	Sync         []SyncResult         `json:"sync"`
	Accumulation []AccumulationResult `json:"accumulation"`
}

// rankJob is what the driver hands the ranks of one mpirun job.
type rankJob struct {
	Plan Plan `json:"plan"`
	// WithFixes runs the goaccel side with a wait loop that never sleeps (the driver also sets
	// RingAlgorithmEnv for the job): the what-if.
	WithFixes bool `json:"with_fixes"`
	// Result is the file rank 0 writes its rankResult to.
	Result string `json:"result"`
}

type rankResult struct {
	AllReduce    []AllReduceResult   `json:"allreduce"`
	Sync         *SyncResult         `json:"sync,omitempty"`
	Accumulation *AccumulationResult `json:"accumulation,omitempty"`
}

func (m *Measurements) add(r *rankResult) {
	m.AllReduce = append(m.AllReduce, r.AllReduce...)
	if r.Sync != nil {
		m.Sync = append(m.Sync, *r.Sync)
	}
	if r.Accumulation != nil {
		m.Accumulation = append(m.Accumulation, *r.Accumulation)
	}
}

// Driver runs the benchmarks: the multi-process measurements as mpirun jobs of Executable, the
// single-process one in this process.
type Driver struct {
	Plan Plan
	// Executable is a binary that runs RunRankJob when given -rank-job (the accelbench command).
	Executable string
	// Progress receives progress messages and the ranks' output (MPI warnings included).
	Progress io.Writer
	// Benchstat receives benchmark result lines as each measurement finishes (nil: none).
	Benchstat io.Writer
	// LaunchOptions are passed on to launch.Command (extra mpirun arguments, for example).
	LaunchOptions []launch.Option

	// build is the value of the "goaccel:" configuration line last written to Benchstat.
	build string
}

// Run measures everything in the plan.
func (d *Driver) Run(ctx context.Context) (*Results, error) {
	res := &Results{Machine: DescribeMachine(), Started: time.Now(), Plan: d.Plan}
	d.printHeader(res.Machine)
	dir, err := os.MkdirTemp("", "accelbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for _, n := range d.Plan.Ranks {
		r, err := d.runJob(ctx, dir, n, rankJob{Plan: d.Plan})
		if err != nil {
			return nil, err
		}
		res.Shipped.add(r)
	}
	if d.Plan.WhatIf {
		res.WithFixes = &Measurements{}
		for _, n := range d.Plan.Ranks {
			r, err := d.runJob(ctx, dir, n, rankJob{Plan: d.Plan, WithFixes: true}, RingAlgorithmEnv)
			if err != nil {
				return nil, err
			}
			res.WithFixes.add(r)
		}
	}
	d.setBuild(buildShipped)
	for _, cfg := range d.Plan.Overhead {
		d.progressf("overhead: %s, batch %d, K=%d\n", cfg.Model.Describe(), cfg.Batch, cfg.K)
		o, err := MeasureOverhead(cfg, d.Plan.OverheadTiming)
		if err != nil {
			return nil, err
		}
		d.emit(o.Goaccel, o.GoMLX)
		res.Overhead = append(res.Overhead, o)
	}
	res.Finished = time.Now()
	res.Machine.LoadAfter = LoadAverage()
	return res, nil
}

func (d *Driver) progressf(format string, args ...any) {
	if d.Progress != nil {
		fmt.Fprintf(d.Progress, "accelbench: "+format, args...)
	}
}

// printHeader writes the configuration lines benchstat reads before the results.
func (d *Driver) printHeader(m Machine) {
	if d.Benchstat == nil {
		return
	}
	fmt.Fprintf(d.Benchstat, "goos: %s\ngoarch: %s\npkg: github.com/goaccel/goaccel/bench\ncpu: %s\n",
		runtime.GOOS, runtime.GOARCH, m.CPU)
}

// The values of the "goaccel:" configuration line, which keeps benchstat from pooling the samples of
// goaccel as shipped with those of the what-if run under the same benchmark names.
const (
	buildShipped   = "shipped"
	buildWithFixes = "with-fixes"
)

// setBuild writes a "goaccel: build" configuration line when the build changes; benchstat applies it to
// the results that follow.
func (d *Driver) setBuild(build string) {
	if d.Benchstat == nil || build == d.build {
		return
	}
	d.build = build
	fmt.Fprintf(d.Benchstat, "goaccel: %s\n", build)
}

// emit writes series as benchstat lines.
func (d *Driver) emit(series ...Series) {
	if d.Benchstat == nil {
		return
	}
	for _, s := range series {
		for _, line := range s.BenchstatLines() {
			fmt.Fprintln(d.Benchstat, line)
		}
	}
}

func (d *Driver) emitRank(r *rankResult) {
	for _, a := range r.AllReduce {
		d.emit(a.Raw, a.Goaccel, a.IallreduceWait, a.IallreduceTest, a.EngineSpin, a.EngineYield)
	}
	if s := r.Sync; s != nil {
		d.emit(s.Flat, s.PerTensor, s.PerTensorAsync)
		for _, c := range s.Caps {
			d.emit(c.Pipelined, c.Sequential)
		}
	}
	if a := r.Accumulation; a != nil {
		d.emit(a.Accumulate, a.SyncEveryMicroBatch, a.SyncEachBatch)
	}
}

// runJob runs one mpirun job of n ranks and returns rank 0's results.
func (d *Driver) runJob(ctx context.Context, dir string, n int, job rankJob, env ...string) (*rankResult, error) {
	what := "goaccel as shipped"
	if job.WithFixes {
		what = fmt.Sprintf("what-if: a wait loop that never sleeps, and %v", env)
	}
	d.progressf("mpirun -np %d: %s\n", n, what)
	job.Result = filepath.Join(dir, fmt.Sprintf("result-%d-%d.json", n, time.Now().UnixNano()))
	jobPath := job.Result + ".job"
	data, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(jobPath, data, 0o644); err != nil {
		return nil, err
	}
	timeout := job.Plan.JobTimeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	progress := d.Progress
	if progress == nil {
		progress = io.Discard
	}
	opts := append([]launch.Option{
		launch.WithEnviron(append(os.Environ(), env...)),
		launch.WithStdio(nil, progress, progress),
	}, d.LaunchOptions...)
	cmd, err := launch.Command(ctx, n, d.Executable, []string{"-" + RankJobFlag, jobPath}, opts...)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("mpirun -np %d did not finish within %s", n, timeout)
		}
		return nil, fmt.Errorf("mpirun -np %d (%s): %w", n, launch.String(cmd.Args), err)
	}
	d.progressf("mpirun -np %d finished in %s\n", n, time.Since(start).Round(time.Second))
	data, err = os.ReadFile(job.Result)
	if err != nil {
		return nil, fmt.Errorf("rank 0 of mpirun -np %d left no results: %w", n, err)
	}
	var r rankResult
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	if job.WithFixes {
		d.setBuild(buildWithFixes)
	} else {
		d.setBuild(buildShipped)
	}
	d.emitRank(&r)
	return &r, nil
}

// RunRankJob is the work of one rank of an mpirun job started by the Driver: it opens goaccel's mpi
// engine and the plain-MPI reference, measures, and on rank 0 writes the results. Progress goes to w from
// rank 0.
func RunRankJob(jobPath string, w io.Writer) (err error) {
	data, err := os.ReadFile(jobPath)
	if err != nil {
		return err
	}
	var job rankJob
	if err := json.Unmarshal(data, &job); err != nil {
		return fmt.Errorf("bench: job file %s: %w", jobPath, err)
	}
	topo, err := backends.DetectTopology()
	if err != nil {
		return err
	}
	if topo.WorldSize < 2 {
		return errors.New("bench: a rank job must run under mpirun with at least 2 ranks")
	}
	// A generous watchdog: a stuck rank fails the job rather than the machine's time budget.
	timeout := backends.WithTimeout(2 * time.Minute)
	var comm *backends.Communicator
	if job.WithFixes {
		var engine backends.Engine
		if engine, err = backends.OpenEngine("mpi", topo); err != nil {
			return err
		}
		comm = newYieldingCommunicator("mpi", engine, timeout)
	} else if comm, err = backends.Open("mpi", topo, timeout); err != nil {
		return err
	}
	defer func() {
		if cerr := comm.Close(); err == nil {
			err = cerr
		}
	}()
	raw, err := OpenRawMPI()
	if err != nil {
		return err
	}
	defer func() {
		if cerr := raw.Close(); err == nil {
			err = cerr
		}
	}()
	// A second engine for the EngineSpin and EngineYield diagnostics: driven directly, without the
	// Communicator's wait loop.
	engine, err := backends.OpenEngine("mpi", topo)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := engine.Close(); err == nil {
			err = cerr
		}
	}()
	// A rank that fails must not leave the others waiting in their next collective until the watchdog
	// fires: end the whole job now (MPI_Abort does not return).
	defer func() {
		if err != nil {
			fmt.Fprintf(w, "accelbench: rank %d of %d: %v\n", topo.Rank, topo.WorldSize, err)
			comm.Abort(1)
		}
	}()
	logf := func(format string, args ...any) {
		if topo.Rank == 0 {
			fmt.Fprintf(w, "accelbench: rank 0 of %d: "+format, append([]any{topo.WorldSize}, args...)...)
		}
	}
	p := job.Plan
	var res rankResult
	logf("all-reduce, %d sizes\n", len(p.AllReduceSizes))
	if res.AllReduce, err = MeasureAllReduce(comm, raw, engine, p.AllReduceSizes, p.AllReduceTiming); err != nil {
		return err
	}
	logf("gradient sync of %s\n", p.SyncModel.Describe())
	s, err := MeasureSync(comm, raw.barrier, p.SyncModel, p.BucketCaps, p.SyncTiming)
	if err != nil {
		return err
	}
	res.Sync = &s
	logf("accumulation: %s, batch %d, K=%d\n", p.Accumulation.Model.Describe(), p.Accumulation.Batch,
		p.Accumulation.K)
	a, err := MeasureAccumulation(comm, raw.barrier, p.Accumulation, p.AccumulationTiming)
	if err != nil {
		return err
	}
	res.Accumulation = &a
	if topo.Rank != 0 {
		return nil
	}
	out, err := json.Marshal(res)
	if err != nil {
		return err
	}
	// Write and rename: the driver never reads half a file from a rank that died while writing.
	if err := os.WriteFile(job.Result+".tmp", out, 0o644); err != nil {
		return err
	}
	return os.Rename(job.Result+".tmp", job.Result)
}
