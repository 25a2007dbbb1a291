package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/goaccel/goaccel/cpu"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// computePlan is the big-MLP measurement: each compute configuration trains in its own child process, so
// that its peak memory is its own.
type computePlan struct {
	Config trainConfig
	// AsShipped makes a child build GoMLX's pure-Go backend itself, with none of goaccel's kernels: no
	// gradient rules, executors or builder wrappers (set per child, for the "GoMLX as shipped" row).
	AsShipped bool `json:",omitempty"`
	Rounds    int  // child processes per configuration, interleaved (0: skip the section)
	// StepTime is how long a child times steps after its warm-up step, within [MinSteps, MaxSteps].
	StepTime           time.Duration
	MinSteps, MaxSteps int
}

// computeConfig is one way of computing a training step, chosen by the environment variables that
// accel.Resolve reads.
type computeConfig struct {
	Name, Slug string
	Env        []string
	AsShipped  bool // GoMLX's own backend, bypassing cpu.New (Env then only documents it)
}

var computeConfigs = []computeConfig{
	{"GoMLX as shipped", "gomlx", []string{"GOMLX_BACKEND=" + cpu.SequentialPureGo}, true},
	{"pure Go", "go", []string{"GOACCEL_GRADIENTS=gemm", "GOACCEL_MATMUL=go"}, false},
	{"BLAS", "blas", []string{"GOACCEL_GRADIENTS=gemm", "GOACCEL_MATMUL=blas"}, false},
}

// computeResult is one configuration's training steps.
type computeResult struct {
	Config computeConfig
	Steps  series // one sample per timed step, over every round
	// PeakRSS is the largest peak resident set of its child processes, in bytes.
	PeakRSS int64
	// Err says why the configuration could not be measured (a build without BLAS, for example).
	Err string `json:",omitempty"`
}

// stepJobFlag starts this binary as a compute child: `accelbench -step-job JSON`, JSON holding the
// computePlan. The child trains GoMLX's train.Trainer on the plan's synthetic batches and prints a
// stepReport.
const stepJobFlag = "step-job"

// stepReport is what a compute child prints.
type stepReport struct {
	Seconds []float64 // of each timed step
	// PeakRSS is the child's own high-water resident set (VmHWM), in bytes. Not its rusage: Linux carries
	// the parent's resident set over into the Maxrss of a child that Go starts with vfork and exec.
	PeakRSS int64
}

func runStepJob(arg string, stdout io.Writer) error {
	var job computePlan
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		return fmt.Errorf("bench: -%s: %w", stepJobFlag, err)
	}
	backend, err := benchBackend(job.AsShipped)
	if err != nil {
		return err
	}
	tr, err := newGoMLXTrainerOn(backend, job.Config, 1)
	if err != nil {
		return err
	}
	if err := tr.steps(1); err != nil { // compiles the graph
		return err
	}
	var report stepReport
	for start := time.Now(); len(report.Seconds) < job.MaxSteps &&
		(len(report.Seconds) < job.MinSteps || time.Since(start) < job.StepTime); {
		stepStart := time.Now()
		if err := tr.steps(1); err != nil {
			return err
		}
		report.Seconds = append(report.Seconds, time.Since(stepStart).Seconds())
	}
	kb, err := strconv.ParseInt(strings.TrimSuffix(firstField("/proc/self/status", "VmHWM", ":"), " kB"), 10, 64)
	if err != nil {
		return fmt.Errorf("bench: reading the peak resident set: %w", err)
	}
	report.PeakRSS = kb << 10
	return json.NewEncoder(stdout).Encode(report)
}

// measureCompute runs every configuration's child once per round, in an order that changes from round
// to round.
func (d *driver) measureCompute(ctx context.Context) ([]computeResult, error) {
	p := d.plan.Compute
	if p.Rounds == 0 {
		return nil, nil
	}
	jobs := make([][]byte, len(computeConfigs))
	for i, c := range computeConfigs {
		job := p
		job.AsShipped = c.AsShipped
		var err error
		if jobs[i], err = json.Marshal(job); err != nil {
			return nil, err
		}
	}
	out := make([]computeResult, len(computeConfigs))
	for i, c := range computeConfigs {
		out[i] = computeResult{Config: c,
			Steps: series{Name: fmt.Sprintf("TrainStep/model=%s/compute=%s", p.Config.Name, c.Slug), Iters: 1}}
	}
	for round := range p.Rounds {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0xc0de)).Perm(len(out)) {
			r := &out[i]
			d.progressf("compute: %s, %s (round %d of %d)\n", p.Config.Model.shortName(), r.Config.Name, round+1, p.Rounds)
			report, err := d.runStepJob(ctx, r.Config.Env, jobs[i])
			if err != nil {
				// One configuration that cannot run (BLAS not built in) must not cost the whole run.
				d.progressf("compute: %s: %v\n", r.Config.Name, err)
				r.Err = err.Error()
				continue
			}
			r.Steps.Seconds = append(r.Steps.Seconds, report.Seconds...)
			r.PeakRSS = max(r.PeakRSS, report.PeakRSS)
		}
	}
	for _, r := range out {
		d.emit(r.Steps)
	}
	return out, nil
}

// runStepJob runs one compute child with env added to this process's environment.
func (d *driver) runStepJob(ctx context.Context, env []string, job []byte) (stepReport, error) {
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, d.exe, "-"+stepJobFlag, string(job))
	cmd.Env = append(os.Environ(), env...) // later entries win
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var report stepReport
	err := cmd.Run()
	if err == nil {
		err = json.Unmarshal(stdout.Bytes(), &report)
	}
	if err != nil {
		// The child's last words say why (the report shows the first line of the error).
		why := strings.TrimSpace(stderr.String())
		return report, fmt.Errorf("%s (%w)\n%v", why[strings.LastIndexByte(why, '\n')+1:], err, env)
	}
	return report, nil
}
