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

// results is everything one run measured: the report is rendered from it, and -json saves it.
type results struct {
	Machine           machine
	Started, Finished time.Time
	Plan              plan

	AllReduce    []allReduceResult
	Sync         []syncResult
	Accumulation []accumulationResult
	Overhead     []overheadResult
	Compute      []computeResult
	EndToEnd     []endToEndResult
	Transformer  []transformerResult
	PureGoCNN    []pureGoResult
	Demo         *demoResult `json:",omitempty"`
}

// rankJob is what the driver hands the ranks of one mpirun job.
type rankJob struct {
	Plan   plan
	Result string // the file rank 0 writes its results to
}

// driver runs the benchmarks: the multi-process measurements as mpirun jobs of exe, the rest in this
// process and in child processes.
type driver struct {
	plan plan
	exe  string // this binary: it runs rank jobs and compute children when given their flags
	// progress receives progress messages and the children's output (MPI's warnings included);
	// benchstat receives benchmark result lines as each measurement finishes.
	progress, benchstat io.Writer
	endToEnd            endToEndSetup
	transformer         transformerSetup
	dir                 string // scratch files of this run
}

func (d *driver) run(ctx context.Context) (*results, error) {
	res := &results{Machine: describeMachine(), Started: time.Now(), Plan: d.plan}
	fmt.Fprintf(d.benchstat, "goos: %s\ngoarch: %s\npkg: github.com/goaccel/goaccel/bench\ncpu: %s\n",
		runtime.GOOS, runtime.GOARCH, res.Machine.CPU)
	dir, err := os.MkdirTemp("", "accelbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	d.dir = dir
	if err := d.checkPrograms(ctx, res, dir); err != nil { // fail before measuring anything else
		return nil, err
	}
	for _, n := range d.plan.Ranks {
		r, err := d.runJob(ctx, n)
		if err != nil {
			return nil, err
		}
		res.AllReduce = append(res.AllReduce, r.AllReduce...)
		res.Sync = append(res.Sync, r.Sync...)
		res.Accumulation = append(res.Accumulation, r.Accumulation...)
	}
	for _, cfg := range d.plan.Overhead {
		d.progressf("overhead: %s, batch %d, K=%d\n", cfg.Model.shortName(), cfg.Batch, cfg.K)
		o, err := measureOverhead(cfg, d.plan.OverheadTiming)
		if err != nil {
			return nil, err
		}
		d.emit(o.Goaccel, o.GoMLX)
		res.Overhead = append(res.Overhead, o)
	}
	if res.Compute, err = d.measureCompute(ctx); err != nil {
		return nil, err
	}
	if res.EndToEnd, err = d.measureEndToEnd(ctx); err != nil {
		return nil, err
	}
	if res.Transformer, err = d.measureTransformer(ctx); err != nil {
		return nil, err
	}
	if res.PureGoCNN, err = d.measurePureGo(ctx); err != nil {
		return nil, err
	}
	if res.Demo, err = d.measureDemo(ctx); err != nil {
		return nil, err
	}
	res.Finished = time.Now()
	res.Machine.LoadAfter = loadAverage()
	return res, nil
}

// checkPrograms checks that every program the plan runs is there, and records PyTorch's version.
func (d *driver) checkPrograms(ctx context.Context, res *results, dir string) error {
	p := d.plan
	var err error
	if len(p.EndToEnd.Models) > 0 || p.Demo.Runs > 0 {
		if _, err := os.Stat(d.endToEnd.demo); err != nil {
			return fmt.Errorf("the e2e and demo sections run the demo: %w (build it with `go build -tags mpi,blas -o %s "+
				"./examples/grad_accum`, or leave them out of -only)", err, d.endToEnd.demo)
		}
	}
	if len(p.EndToEnd.Models) > 0 || p.Transformer.Rounds > 0 {
		if res.Machine.PyTorch, err = d.endToEnd.checkPyTorch(ctx); err != nil {
			return err
		}
	}
	if len(p.EndToEnd.Models) > 0 {
		if err := d.endToEnd.writeScript(dir); err != nil {
			return err
		}
	}
	if p.Transformer.Rounds > 0 {
		if err := d.transformer.check(dir); err != nil {
			return err
		}
	}
	if p.PureGoCNN.Rounds > 0 {
		return checkDemoPureGo(p.PureGoCNN, d.endToEnd)
	}
	return nil
}

func (d *driver) progressf(format string, args ...any) {
	fmt.Fprintf(d.progress, "accelbench: "+format, args...)
}

// emit writes series as benchstat lines.
func (d *driver) emit(all ...series) {
	for _, s := range all {
		for _, line := range s.benchstatLines() {
			fmt.Fprintln(d.benchstat, line)
		}
	}
}

// runJob runs one mpirun job of n ranks and returns rank 0's results.
func (d *driver) runJob(ctx context.Context, n int) (*results, error) {
	d.progressf("mpirun -np %d: all-reduce, bucketing, accumulation\n", n)
	job := rankJob{Plan: d.plan, Result: filepath.Join(d.dir, fmt.Sprintf("ranks-%d.json", n))}
	data, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	cmd, err := launch.Command(ctx, n, d.exe, []string{"-" + rankJobFlag, string(data)},
		launch.WithStdio(nil, d.progress, d.progress))
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("mpirun -np %d did not finish within %s", n, d.plan.JobTimeout)
		}
		return nil, fmt.Errorf("mpirun -np %d (%s): %w", n, launch.String(cmd.Args), err)
	}
	d.progressf("mpirun -np %d finished in %s\n", n, time.Since(start).Round(time.Second))
	var r results
	if data, err = os.ReadFile(job.Result); err != nil {
		return nil, fmt.Errorf("rank 0 of mpirun -np %d left no results: %w", n, err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	for _, a := range r.AllReduce {
		d.emit(a.Raw, a.Goaccel, a.Iallreduce)
	}
	for _, s := range r.Sync {
		d.emit(s.Flat, s.PerTensor, s.PerTensorAsync)
		for _, c := range s.Caps {
			d.emit(c.Pipelined, c.Sequential)
		}
	}
	for _, a := range r.Accumulation {
		d.emit(a.Accumulate, a.SyncEveryMicroBatch, a.SyncEachBatch)
	}
	return &r, nil
}

// rankJobFlag is the flag with which the driver starts this binary as the ranks of an mpirun job:
// `accelbench -rank-job JSON`, JSON holding a rankJob.
const rankJobFlag = "rank-job"

// runRankJob is the work of one rank of an mpirun job: it opens goaccel's mpi engine and the plain-MPI
// reference, measures, and on rank 0 writes the results. Rank 0's progress goes to w.
func runRankJob(arg string, w io.Writer) (err error) {
	var job rankJob
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		return fmt.Errorf("bench: -%s: %w", rankJobFlag, err)
	}
	topo, err := backends.DetectTopology()
	if err != nil {
		return err
	}
	if topo.WorldSize < 2 {
		return errors.New("bench: a rank job must run under mpirun with at least 2 ranks")
	}
	// A generous watchdog: a stuck rank fails the job rather than the machine's time budget.
	comm, err := backends.Open("mpi", topo, backends.WithTimeout(2*time.Minute))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, comm.Close()) }()
	raw, err := openRawMPI()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, raw.close()) }()
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
	var res results
	logf("all-reduce, %d sizes\n", len(p.AllReduceSizes))
	if res.AllReduce, err = measureAllReduce(comm, raw, p.AllReduceSizes, p.AllReduceTiming); err != nil {
		return err
	}
	logf("gradient sync of %s\n", p.SyncModel.describe())
	s, err := measureSync(comm, raw.barrier, p.SyncModel, p.BucketCaps, p.SyncTiming)
	if err != nil {
		return err
	}
	res.Sync = []syncResult{s}
	for _, cfg := range p.Accumulation {
		logf("accumulation: %s, batch %d, K=%d\n", cfg.Model.shortName(), cfg.Batch, cfg.K)
		a, err := measureAccumulation(comm, raw.barrier, cfg, p.AccumulationTiming)
		if err != nil {
			return err
		}
		res.Accumulation = append(res.Accumulation, a)
	}
	if topo.Rank != 0 {
		return nil
	}
	return writeJSON(job.Result, res)
}

// writeJSON writes v to path through a rename, so that no reader ever sees half a file.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
