// Package accel is goaccel's facade: an Accelerator that a GoMLX training loop adds a few lines for, so the
// same program trains on one CPU, one GPU, several GPUs or several machines. It decides where the process
// runs (topology, compute backend, collective engine), what data it sees (sharded loaders) and when
// gradients are exchanged (Accumulate, NoSync); the work itself is done by packages backends, accumulate
// and prepare.
package accel

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	gomlxbackends "github.com/gomlx/gomlx/backends"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	_ "github.com/goaccel/goaccel/backends/mpi" // registers "mpi" when built with -tags mpi
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // registers goaccel's kernels for the pure-Go backend
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/userstate"
)

// Accelerator runs a training loop on this process's share of the job.
type Accelerator struct {
	cfg     config
	topo    backends.Topology
	comm    *backends.Communicator
	ownComm bool
	compute gomlxbackends.Backend
	state   *accumulate.GradientState
	rt      *prepare.Runtime

	models     []*prepare.Model
	optimizers []*prepare.Optimizer
	loaders    []*prepare.DataLoader
	closed     bool
	// settingsAgreed: the ranks compared their settings (on the first Backward) and found them equal.
	settingsAgreed bool
	// logRecords counts the records Log wrote (on the main process), which checkpoints keep.
	logRecords int64
	// checkpointLocks are the checkpoint directories this job holds (on the main process), by path.
	checkpointLocks map[string]*checkpoint.Lock
	// userState holds the program's values registered for checkpointing.
	userState userstate.Registry
	// hang writes this rank's hang report when asked (hang.go); stragglers times the optimizer steps and
	// finds a rank that is persistently slower (stragglers.go).
	hang       *hangReports
	stragglers *stragglers
	// timeline records the job's timeline (timeline.go); nil when off.
	timeline *timeline
	// join is the Join running, if any (see join.go).
	join *joinState
}

// New starts the accelerator: it reads the topology from the launcher's environment, opens the collective
// engine (single process, or MPI under mpirun/srun) and the GoMLX compute backend (pure Go unless XLA is
// asked for or installed). Under a launcher every process calls it: the processes compare their debug mode
// (and, with WithCheckpointDir, learn whether the main process could take the checkpoint directory) before
// New returns, so all fail alike.
func New(opts ...Option) (*Accelerator, error) {
	cfg, err := resolve(os.LookupEnv, opts)
	if err != nil {
		return nil, err
	}
	a := &Accelerator{cfg: cfg}
	if err := a.openCommunicator(); err != nil {
		return nil, err
	}
	computeCfg := cfg.computeConfig(a.topo)
	if share := a.comm.KernelShare(); computeCfg.Threads == 0 && share.Ranks > a.topo.LocalSize {
		// More of the job's ranks share this kernel than the launcher placed on this node (containers,
		// emulated hosts): they share its processors, so each takes its part of them.
		computeCfg.Threads = share.ThreadsPerRank()
	}
	a.compute, err = cpu.New(computeCfg)
	if err != nil {
		err = fmt.Errorf("accel: %w", err)
		a.closeComm(err)
		return nil, err
	}
	a.state, err = accumulate.NewGradientState(cfg.accumulationSteps, cfg.syncEachBatch)
	if err != nil {
		err = fmt.Errorf("accel: %w", err)
		a.closeComm(err)
		return nil, err
	}
	// Debug mode adds a collective before every collective: ranks that disagree on it would misread each
	// other's messages from the first one on. They compare it first, before any check is on. Only for the
	// job's own communicator (processes start together); with WithCommunicator the caller may create the
	// ranks' accelerators one after the other, and chooses the call checks itself.
	if a.ownComm && a.topo.WorldSize > 1 {
		debug := []replicas.Setting{{Name: "debug mode (GOACCEL_DEBUG or accel.WithDebug)", Value: fmt.Sprint(cfg.debug)}}
		if err := replicas.CheckSameSettings(a.comm, debug); err != nil {
			err = fmt.Errorf("accel: %w", err)
			a.closeAfterNew(err)
			return nil, err
		}
	}
	if cfg.debug {
		a.comm.SetCallChecks(true)
	}
	a.rt = &prepare.Runtime{Backend: a.compute, Comm: a.comm, State: a.state,
		BucketCapBytes: int64(cfg.bucketCapMB * (1 << 20)), MemoryLimit: cfg.memoryLimit, Overlap: cfg.overlap}
	if cpu.IsPureGo(a.compute) && cpu.OpsMeasurable() {
		// The backend's parallel schedule or one operation after another, whichever the program's own
		// first micro-batches run faster with (prepare/opsschedule.go).
		backend := a.compute
		a.rt.MeasureOpsSchedule = func(sequential, measured bool) error {
			return cpu.SetSequentialOps(backend, sequential, measured)
		}
	}
	a.rt.Sharding = cfg.shardingOrDefault()
	a.rt.LocalSGD = cfg.localSGD
	if cfg.compression != accumulate.NoCompression {
		if a.rt.CommHook, err = accumulate.NewCompressionHook(cfg.compression); err != nil {
			err = fmt.Errorf("accel: %w", err)
			a.closeAfterNew(err)
			return nil, err
		}
	}
	if cfg.powerSGD != nil {
		if err := a.usePowerSGD(*cfg.powerSGD); err != nil {
			a.closeAfterNew(err)
			return nil, err
		}
	}
	a.comm.SetDescriber(a.describe)
	a.observe()
	a.startTimeline()
	// A binary whose GoMLX is not the release goaccel's kernels were written for trains on GoMLX's own
	// kernels: correct, but several times slower, so the job's first line says why.
	if k := cpu.CurrentKernels(); k.Inert != "" && cpu.IsPureGo(a.compute) {
		a.Printf("goaccel: %s\n", k.Inert)
	}
	if cfg.checkpointDir != "" {
		if err := a.holdCheckpointDir(cfg.checkpointDir); err != nil {
			a.releaseCheckpointDirs()
			a.closeAfterNew(err)
			return nil, err
		}
	}
	return a, nil
}

func (a *Accelerator) openCommunicator() error {
	if a.cfg.comm != nil {
		a.comm = a.cfg.comm
		size, rank := a.comm.Size(), a.comm.Rank()
		a.topo = backends.Topology{Rank: rank, WorldSize: size, LocalRank: rank, LocalSize: size, Nodes: 1,
			Source: a.comm.Name()}
		if a.cfg.timeout > 0 {
			a.comm.SetTimeout(a.cfg.timeout)
		}
		return nil
	}
	topo, err := backends.DetectTopology()
	if err != nil {
		return fmt.Errorf("accel: %w", err)
	}
	a.topo = topo
	engine := a.cfg.engine
	if engine == "" {
		engine = "single"
		if topo.WorldSize > 1 {
			engine = "mpi"
		}
	}
	if topo.WorldSize > 1 && !backends.EngineRegistered(engine) {
		// Never train N independent models silently.
		return fmt.Errorf("accel: this process is rank %d of %d (launched by %s) but the %q collective engine is "+
			"not linked into the binary: rebuild it with `go build -tags mpi`", topo.Rank, topo.WorldSize,
			topo.Source, engine)
	}
	var commOpts []backends.CommunicatorOption
	if a.cfg.timeout > 0 {
		commOpts = append(commOpts, backends.WithTimeout(a.cfg.timeout))
	}
	a.comm, err = backends.Open(engine, topo, commOpts...)
	if err != nil {
		return fmt.Errorf("accel: %w", err)
	}
	a.ownComm = true
	return nil
}

func (a *Accelerator) describe() string {
	steps := int64(0)
	for _, o := range a.optimizers {
		steps = max(steps, o.Steps())
	}
	step := fmt.Sprintf("optimizer step %d", steps+1)
	// What the prepared objects say they are doing, within the step: "backward of micro-batch 471
	// (optimizer step 12)"; the optimizer step's own phases name their step.
	switch p := a.rt.Phase(); p.Kind {
	case prepare.PhaseNone, prepare.PhaseLoad:
		return step
	case prepare.PhaseBackward, prepare.PhaseForwardBackward:
		return p.String() + " (" + step + ")"
	default:
		return p.String()
	}
}

// closeComm releases the communicator New opened when New fails. With several processes it only tells the
// others that this rank failed (they stop waiting for it, naming it): closing would end the job from inside
// New, before the caller could print the error. The job ends when this process exits, or when the others
// close on the failure.
// closeAfterNew ends the communicator of a New that fails after a collective: together with the other
// ranks when they all reached the same error (a clean close), else as closeComm does for a rank that
// fails alone (a peer that left broke the collective).
func (a *Accelerator) closeAfterNew(cause error) {
	if a.ownComm && a.comm.Broken() == nil {
		_ = a.comm.Close()
		return
	}
	a.closeComm(cause)
}

func (a *Accelerator) closeComm(cause error) {
	if !a.ownComm {
		return
	}
	if a.comm.Size() > 1 {
		a.comm.Fail(cause)
		return
	}
	_ = a.comm.Close()
}

// Close releases the collective engine (for MPI: finalises it). Call it once, at the end of the program.
//
// With several processes, closing is collective: Close returns once every rank closed. A rank still
// waiting for this one in a collective (because this rank stopped early) learns that it closed and fails
// with a *backends.PeerError instead of hanging; this rank's Close then aborts the job. When this rank
// stops because of an error, prefer CloseWithError, which tells the other ranks what the error was.
// After a failed collective Close aborts the job (see backends.Communicator.Close).
func (a *Accelerator) Close() error {
	if a.closed {
		return nil
	}
	a.closed = true
	a.stopObserving()
	trackersErr := errors.Join(a.finishTimeline(), a.closeTrackers(), a.releaseCheckpointDirs())
	if a.ownComm {
		return errors.Join(a.comm.Close(), trackersErr)
	}
	return trackersErr
}

// CloseWithError is Close for a rank that stops because of err. With several processes it tells the other
// ranks that this rank failed and why: those waiting for it in a collective return a *backends.PeerError
// naming this rank and carrying err's text. It then ends the whole job with a non-zero exit code, once the
// others had a moment to report (a few seconds), so it does not return under MPI: print err first.
// On one process, or with a nil err, it is Close.
//
//	defer func() {
//		if err != nil {
//			fmt.Fprintf(os.Stderr, "rank %d: %v\n", acc.Rank(), err)
//		}
//		_ = acc.CloseWithError(err)
//	}()
func (a *Accelerator) CloseWithError(err error) error {
	if err != nil && !a.closed && a.topo.WorldSize > 1 {
		a.comm.Fail(err)
	}
	return a.Close()
}

// Rank is this process's rank in the job.
func (a *Accelerator) Rank() int { return a.topo.Rank }

// WorldSize is the number of processes in the job.
func (a *Accelerator) WorldSize() int { return a.topo.WorldSize }

// LocalRank is this process's rank on its node.
func (a *Accelerator) LocalRank() int { return a.topo.LocalRank }

// Topology is where this process sits in the job.
func (a *Accelerator) Topology() backends.Topology { return a.topo }

// IsMainProcess reports whether this is rank 0, the process that logs and writes checkpoints.
func (a *Accelerator) IsMainProcess() bool { return a.topo.IsMain() }

// IsLocalMainProcess reports whether this is the first process on its node.
func (a *Accelerator) IsLocalMainProcess() bool { return a.topo.IsLocalMain() }

// Backend is the GoMLX compute backend.
func (a *Accelerator) Backend() gomlxbackends.Backend { return a.compute }

// Communicator is the collective communicator.
func (a *Accelerator) Communicator() *backends.Communicator { return a.comm }

// GradientAccumulationSteps is K, the micro-batches per optimizer step.
func (a *Accelerator) GradientAccumulationSteps() int { return a.state.Steps() }

// Seed is the seed loaders shuffle with.
func (a *Accelerator) Seed() uint64 { return a.cfg.seed }

// Print prints on the main process only, like fmt.Println.
func (a *Accelerator) Print(args ...any) {
	if a.IsMainProcess() {
		fmt.Fprintln(a.cfg.out, args...)
	}
}

// Printf prints on the main process only, like fmt.Printf.
func (a *Accelerator) Printf(format string, args ...any) {
	if a.IsMainProcess() {
		fmt.Fprintf(a.cfg.out, format, args...)
	}
}

// Output is where Print writes.
func (a *Accelerator) Output() io.Writer { return a.cfg.out }

var errClosed = errors.New("accel: accelerator is closed")

func (a *Accelerator) checkOpen() error {
	if a.closed {
		return errClosed
	}
	return nil
}

// Stats summarises what the accelerator did so far on this rank.
type Stats struct {
	OptimizerSteps int64
	SkippedSteps   int64
	// Syncs counts gradient all-reduce rounds: one per optimizer step, or one per micro-batch with
	// WithSyncEachBatch.
	Syncs        int64
	MicroBatches int64
	// Collectives are the communicator's counters: calls, bytes, and time spent waiting, per operation.
	Collectives backends.Stats
	// ComputeTime is time spent in compiled training and optimizer steps.
	ComputeTime time.Duration
	// StepMedian and StepP95 are this rank's optimizer step time, median and 95th percentile: its own
	// share of a step, less its waits for the other ranks (see RankTiming; RankTimings has every rank's).
	StepMedian, StepP95 time.Duration
	// CommHook is what the hook that carries the gradient buckets sent, for a hook that counts it
	// (PowerSGD: its compression ratio).
	CommHook accumulate.HookStats
	// Sharding names the strategy the models' state is split with ("replicated" on one process, whatever
	// WithSharding asked for), and OptimizerStateBytes is the size of the optimizer state this process
	// holds: 1/N of the replicated size under a strategy that splits buckets.
	Sharding            string
	OptimizerStateBytes int64
	// Mode says when the processes exchange what: "synchronous" (gradients every step), or local SGD's
	// or DiLoCo's configuration ("local SGD (H=8)"); ParameterAverages counts local SGD's averages of the
	// parameters (Collectives counts their all-reduces and bytes with the others).
	Mode              string
	ParameterAverages int64
	// Overlap counts the gradient buckets whose all-reduce started inside a training step, while its
	// backward pass ran (WithOverlap; each is also part of the sync Syncs counts), and what those
	// all-reduces got done inside their steps.
	Overlap accumulate.OverlapStats
}

// Stats returns the counters so far.
func (a *Accelerator) Stats() Stats {
	s := Stats{Collectives: a.comm.Stats(), Sharding: a.rt.Sharding.Name(), Mode: a.rt.LocalSGD.String()}
	if a.WorldSize() == 1 {
		s.Sharding = accumulate.Replicated{}.Name()
	}
	if h, ok := a.rt.CommHook.(accumulate.StatsReporter); ok {
		s.CommHook = h.Stats()
	}
	t := a.rankTiming()
	s.StepMedian, s.StepP95 = t.StepMedian, t.StepP95
	for _, m := range a.models {
		if m.Materialized() {
			s.OptimizerStateBytes += a.layout(m).OptimizerStateBytes()
		}
		s.MicroBatches += m.MicroSteps()
		s.ComputeTime += m.ComputeTime()
		if r := m.Reducer(); r != nil {
			s.Syncs += r.Syncs()
			o := r.OverlapStats()
			s.Overlap.Buckets += o.Buckets
			s.Overlap.DoneInStep += o.DoneInStep
			s.Overlap.InStep += o.InStep
		}
	}
	for _, o := range a.optimizers {
		s.OptimizerSteps += o.Steps()
		s.SkippedSteps += o.SkippedSteps()
		s.ParameterAverages += o.ParameterAverages()
		s.ComputeTime += o.ComputeTime()
	}
	return s
}

// powerSGDStateName is the name the PowerSGD hook's state has among a checkpoint's registered values.
const powerSGDStateName = "goaccel/powersgd"

// usePowerSGD installs the PowerSGD hook and registers its state for checkpoints: each process's own (the
// error feedback), resized onto another number of processes with zero errors, and optional, so that a run
// that turns PowerSGD on can resume a checkpoint saved without it.
func (a *Accelerator) usePowerSGD(cfg accumulate.PowerSGDConfig) error {
	hook, err := accumulate.NewPowerSGDHook(cfg)
	if err != nil {
		return fmt.Errorf("accel: %w", err)
	}
	a.rt.CommHook = hook
	return a.userState.Register(powerSGDStateName, hook, userstate.PerRank(), userstate.Resize(hook.ResizeState),
		userstate.Optional())
}
