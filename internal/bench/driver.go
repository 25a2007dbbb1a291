package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/launch"
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
	ResNet       []endToEndResult `json:",omitempty"`
	LSTM         []lstmResult     `json:",omitempty"`
	PureGoCNN    []pureGoResult
	Demo         *demoResult `json:",omitempty"`
	Network      []networkResult
	// NetworkSkipped says why section 6, though planned, was not measured ("": it was, or was not planned).
	NetworkSkipped string `json:",omitempty"`
	// NetworkSync is what a network rank job measured (its results land in Network).
	NetworkSync []networkSyncResult `json:",omitempty"`
	// NetworkAllReduce is a network rank job's all-reduces timed alone (its results land in Network).
	NetworkAllReduce []sizedSeries `json:",omitempty"`
	// Sharding is the ZeRO section: each strategy's memory and step time (a sharding rank job returns one).
	Sharding []shardingResult `json:",omitempty"`
}

// rankJob is what the driver hands the ranks of one mpirun job.
type rankJob struct {
	Plan plan
	// Network, when set, makes the job measure section 6's gradient syncs instead of sections 1, 2 and 3.
	Network *networkSyncJob `json:",omitempty"`
	// Sharding, when set, makes the job train under one sharding strategy instead (on 1 process too).
	Sharding *shardingJob `json:",omitempty"`
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
	resNet              resNetSetup
	lstm                lstmSetup
	dir                 string // scratch files of this run
	// numCPU is the machine's core count, which PyTorch's candidate thread counts come from (0:
	// runtime.NumCPU).
	numCPU int
	// hosts are the -hosts the MPI jobs and section 6 run across; nil: this machine (and section 6 on
	// emulated clusters).
	hosts *hostSet
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
	if res.ResNet, err = d.measureResNet(ctx); err != nil {
		return nil, err
	}
	if res.LSTM, err = d.measureLSTM(ctx); err != nil {
		return nil, err
	}
	if res.PureGoCNN, err = d.measurePureGo(ctx); err != nil {
		return nil, err
	}
	if res.Demo, err = d.measureDemo(ctx); err != nil {
		return nil, err
	}
	if res.Network, res.NetworkSkipped, err = d.measureNetwork(ctx); err != nil {
		return nil, err
	}
	if res.Sharding, err = d.measureSharding(ctx); err != nil {
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
	if len(p.EndToEnd.Models) > 0 || p.Demo.Runs > 0 || len(p.Network.Rates) > 0 {
		if _, err := os.Stat(d.endToEnd.demo); err != nil {
			return fmt.Errorf("the e2e, demo and network sections run the demo: %w (build it with `go build -tags mpi,blas -o %s "+
				"./examples/grad_accum`, or leave them out of -only)", err, d.endToEnd.demo)
		}
	}
	if len(p.EndToEnd.Models) > 0 || p.Transformer.Rounds > 0 || p.ResNet.Rounds > 0 || p.LSTM.Rounds > 0 ||
		len(p.Network.Rates) > 0 {
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
	if p.ResNet.Rounds > 0 {
		if err := d.resNet.check(dir); err != nil {
			return err
		}
	}
	if p.LSTM.Rounds > 0 {
		if err := d.lstm.check(dir); err != nil {
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

// runJob runs one mpirun job of n ranks for sections 1, 2 and 3 and returns rank 0's results.
func (d *driver) runJob(ctx context.Context, n int) (*results, error) {
	d.progressf("mpirun -np %d: all-reduce, bucketing, accumulation\n", n)
	r, err := d.runRanks(ctx, n, d.hosts, rankJob{Plan: d.plan})
	if err != nil {
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
	return r, nil
}

// runRanks starts this binary as the n ranks of an mpirun job, on this machine or across hosts, and returns
// the results rank 0 writes to its standard output.
func (d *driver) runRanks(ctx context.Context, n int, hosts *hostSet, job rankJob) (*results, error) {
	data, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	args := []string{"-" + rankJobFlag, string(data)}
	var cmd *exec.Cmd
	if hosts != nil {
		cmd, err = hosts.mpirun(ctx, n, d.exe, args, os.Environ())
	} else {
		cmd, err = launch.Command(ctx, n, d.exe, args)
	}
	if err != nil {
		return nil, err
	}
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, d.progress
	start := time.Now()
	err = cmd.Run()
	line, found := resultsLine(stdout.Bytes(), d.progress)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("mpirun -np %d did not finish within %s", n, d.plan.JobTimeout)
		}
		return nil, fmt.Errorf("mpirun -np %d (%s): %w", n, launch.String(cmd.Args), err)
	}
	d.progressf("mpirun -np %d finished in %s\n", n, time.Since(start).Round(time.Second))
	if !found {
		return nil, fmt.Errorf("rank 0 of mpirun -np %d wrote no results (%s)", n, launch.String(cmd.Args))
	}
	var r results
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("rank 0's results: %w", err)
	}
	return &r, nil
}

// rankJobFlag is the flag with which the driver starts this binary as the ranks of an mpirun job:
// `accelbench -rank-job JSON`, JSON holding a rankJob.
const rankJobFlag = "rank-job"

// runRankJob is the work of one rank of an mpirun job: it opens goaccel's mpi engine and the plain-MPI
// reference, measures, and rank 0 writes the results to stdout, on a line of their own. Rank 0's progress
// goes to w.
func runRankJob(arg string, stdout, w io.Writer) (err error) {
	var job rankJob
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		return fmt.Errorf("bench: -%s: %w", rankJobFlag, err)
	}
	if job.Sharding != nil {
		// Before anything else opens MPI: the Accelerator opens it, as in a training program.
		return runShardingRank(*job.Sharding, stdout, w)
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
	if job.Network != nil {
		logf("network (%s): gradient syncs of %d models\n", job.Network.Label, len(job.Network.Layouts))
		if res.NetworkSync, err = measureNetworkSync(comm, raw.barrier, *job.Network); err != nil {
			return err
		}
		if res.NetworkAllReduce, err = measureNetworkAllReduce(comm, raw.barrier, *job.Network); err != nil {
			return err
		}
		return writeResultsLine(stdout, topo.Rank, res)
	}
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
	return writeResultsLine(stdout, topo.Rank, res)
}

// writeResultsLine writes rank 0's results, as one line that the driver finds in mpirun's output.
func writeResultsLine(stdout io.Writer, rank int, res results) error {
	if rank != 0 {
		return nil
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s%s\n", resultsLinePrefix, data)
	return err
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
