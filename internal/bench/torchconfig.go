package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// PyTorch's configuration. Every end-to-end row runs PyTorch the way it is fastest on the machine, not the
// way goaccel happens to run: on small machines PyTorch in one process can be faster with fewer threads than
// cores (docs/benchmarks-method.md, Note [one process, one thread]), and OpenBLAS's kernels depend on
// OPENBLAS_CORETYPE (Note [OPENBLAS_CORETYPE]). Before a section's rounds, a short calibration runs each
// candidate configuration of each PyTorch row, interleaved; the fastest that computes correctly runs the row.
// goaccel's runs keep the environment as it is.

// openBLASCoreType is the variable with which OpenBLAS is told which core's kernels to run.
const openBLASCoreType = "OPENBLAS_CORETYPE"

// calibrationPlan sizes the calibration of PyTorch's configuration.
type calibrationPlan struct {
	// Rounds are the runs of each candidate, interleaved (0: no calibration; PyTorch runs with cores /
	// processes threads and the environment's OPENBLAS_CORETYPE).
	Rounds int
	// Examples are the training examples of an image-classification or LSTM calibration run (0: the row's own).
	Examples int
	// Steps are the optimizer steps of a transformer calibration run (0: the row's own).
	Steps int
}

// shorter is how many of n units (examples, steps) a calibration run trains, 0 standing for all as in -limit:
// at most limit when limit > 0.
func shorter(n, limit int) int {
	if limit > 0 && (n == 0 || n > limit) {
		return limit
	}
	return n
}

// torchConfig is how a PyTorch run computes.
type torchConfig struct {
	Threads int // compute threads per process
	// UnsetCoreType runs PyTorch without the environment's OPENBLAS_CORETYPE: OpenBLAS then runs the
	// processor's own kernels.
	UnsetCoreType bool `json:",omitempty"`
}

// String is "1 thread" or "2 threads, OPENBLAS_CORETYPE unset".
func (c torchConfig) String() string {
	s := fmt.Sprintf("%d threads", c.Threads)
	if c.Threads == 1 {
		s = "1 thread"
	}
	if c.UnsetCoreType {
		s += ", " + openBLASCoreType + " unset"
	}
	return s
}

// torchCandidates are PyTorch's candidate configurations for procs processes on cores cores: 1 to
// cores/procs threads per process, each with the environment's OPENBLAS_CORETYPE (coreType, "" when unset)
// and, when the environment sets it, without. They are in order of preference on a tie: cores/procs
// threads first (matched threads, the comparison the page made before calibration), then fewer; with
// the environment's setting before without.
func torchCandidates(cores, procs int, coreType string) []torchConfig {
	var out []torchConfig
	for threads := max(1, cores/max(procs, 1)); threads >= 1; threads-- {
		out = append(out, torchConfig{Threads: threads})
		if coreType != "" {
			out = append(out, torchConfig{Threads: threads, UnsetCoreType: true})
		}
	}
	return out
}

// qualityCheck says when a candidate without OPENBLAS_CORETYPE computes correctly: its figure (test
// accuracy, validation or final loss) agrees with that of the same thread count with it, within the row's
// own tolerance.
type qualityCheck struct {
	Name      string  // "test accuracy", "validation loss", ...
	Tolerance float64 // absolute, or with Relative a fraction of the reference
	Relative  bool
	Format    string `json:",omitempty"` // how the page prints the figure ("": "%.4f")
}

// show prints a quality figure as the page does.
func (q qualityCheck) show(x float64) string {
	if q.Format == "" {
		return fmt.Sprintf("%.4f", x)
	}
	return fmt.Sprintf(q.Format, x)
}

// agrees says whether got is within the tolerance of ref; non-finite figures never agree.
func (q qualityCheck) agrees(got, ref float64) bool {
	if math.IsNaN(got) || math.IsInf(got, 0) || math.IsNaN(ref) || math.IsInf(ref, 0) {
		return false
	}
	bound := q.Tolerance
	if q.Relative {
		bound *= math.Abs(ref)
	}
	return math.Abs(got-ref) <= bound*(1+1e-9)
}

// tolerance is "0.01" or, relative, "2%".
func (q qualityCheck) tolerance() string {
	if q.Relative {
		return fmt.Sprintf("%g%%", 100*q.Tolerance)
	}
	return fmt.Sprintf("%g", q.Tolerance)
}

// torchCandidate is one candidate's calibration runs.
type torchCandidate struct {
	Config torchConfig
	// PerUnit is seconds per example (or token), one sample per calibration run.
	PerUnit series
	Quality []float64 // the quality figure of each run
	// Err is why a run failed: only a candidate without OPENBLAS_CORETYPE may fail, which rules it out.
	Err      string `json:",omitempty"`
	Eligible bool
	Why      string `json:",omitempty"` // why it is not eligible
}

// torchChoice is how a PyTorch row's configuration was chosen.
type torchChoice struct {
	CoreType string // OPENBLAS_CORETYPE in the environment ("": unset)
	Check    qualityCheck
	Rounds   int              // calibration rounds (0: none, Chosen is the only candidate or the default)
	Only     bool             `json:",omitempty"` // Chosen was the only candidate
	Cands    []torchCandidate `json:"Candidates,omitempty"`
	Chosen   torchConfig
}

// chooseTorch marks which candidates are eligible and returns the index of the fastest eligible one (the
// first of equals). A candidate with the environment's OPENBLAS_CORETYPE is eligible when it ran: it is the
// configuration the row ran before calibration, the reference for correctness. One without it is eligible
// when it ran and its median quality figure agrees (check) with that of the candidate of the same thread
// count with it. It returns -1 when none is eligible.
func chooseTorch(cands []torchCandidate, check qualityCheck) int {
	reference := func(threads int) *torchCandidate {
		for i := range cands {
			if c := &cands[i]; !c.Config.UnsetCoreType && c.Config.Threads == threads {
				return c
			}
		}
		return nil
	}
	best := -1
	for i := range cands {
		c := &cands[i]
		c.Eligible, c.Why = false, ""
		switch {
		case c.Err != "":
			c.Why = "failed: " + c.Err
		case len(c.PerUnit.Seconds) == 0:
			c.Why = "not run"
		case !c.Config.UnsetCoreType:
			c.Eligible = true
		default:
			ref := reference(c.Config.Threads)
			if ref == nil || ref.Err != "" || len(ref.Quality) == 0 {
				c.Why = fmt.Sprintf("no run with %s of %s to check it against", openBLASCoreType, torchConfig{Threads: c.Config.Threads})
				break
			}
			got, want := quantile(c.Quality, 0.5), quantile(ref.Quality, 0.5)
			if c.Eligible = check.agrees(got, want); !c.Eligible {
				c.Why = fmt.Sprintf("%s %s against %s with %s", check.Name, check.show(got), check.show(want), openBLASCoreType)
			}
		}
		if c.Eligible && (best < 0 || c.PerUnit.median() < cands[best].PerUnit.median()) {
			best = i
		}
	}
	return best
}

// torchRun trains PyTorch once in a configuration, for calibration, and returns seconds per unit (example
// or token) and the quality figure.
type torchRun func(ctx context.Context, cfg torchConfig) (perUnit, quality float64, err error)

// cores is the machine's core count, as the candidates' thread counts are drawn from it.
func (d *driver) cores() int {
	if d.numCPU > 0 {
		return d.numCPU
	}
	return runtime.NumCPU()
}

// choosePyTorch chooses the configuration of a PyTorch row of procs processes (label names it in progress
// messages): with one candidate, that one; otherwise each candidate trains d.plan.Calibration.Rounds times,
// interleaved in an order that changes from round to round, and the fastest eligible one wins (chooseTorch).
// Only a candidate without OPENBLAS_CORETYPE may fail: that rules it out.
// units are the examples or tokens of one calibration run.
func (d *driver) choosePyTorch(ctx context.Context, label string, procs, units int, check qualityCheck, run torchRun) (*torchChoice, error) {
	coreType := os.Getenv(openBLASCoreType)
	configs := torchCandidates(d.cores(), procs, coreType)
	choice := &torchChoice{CoreType: coreType, Check: check, Chosen: configs[0], Only: len(configs) == 1}
	rounds := d.plan.Calibration.Rounds
	if rounds == 0 || choice.Only {
		return choice, nil
	}
	choice.Rounds = rounds
	cands := make([]torchCandidate, len(configs))
	for i, cfg := range configs {
		cands[i] = torchCandidate{Config: cfg, PerUnit: series{Name: label + "/" + cfg.String(), Iters: units}}
	}
	for round := range rounds {
		// Rounds come in pairs, the second in the first's reverse order: with two candidates, as on a
		// one-process row of a 2-core machine, each runs first as often as the other.
		order := rand.New(rand.NewPCG(uint64(round/2), 0xca1)).Perm(len(cands))
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			c := &cands[i]
			if c.Err != "" {
				continue
			}
			d.progressf("%s: calibrating PyTorch with %s (round %d of %d)\n", label, c.Config, round+1, rounds)
			perUnit, quality, err := run(ctx, c.Config)
			if err != nil {
				if !c.Config.UnsetCoreType || ctx.Err() != nil {
					return nil, fmt.Errorf("calibrating PyTorch with %s: %w", c.Config, err)
				}
				c.Err = failure(err)
				continue
			}
			c.PerUnit.Seconds = append(c.PerUnit.Seconds, perUnit)
			c.Quality = append(c.Quality, quality)
		}
	}
	best := chooseTorch(cands, check)
	if best < 0 { // cannot happen: the environment's candidates fail the run instead
		return nil, fmt.Errorf("calibrating PyTorch: no candidate ran")
	}
	choice.Cands, choice.Chosen = cands, cands[best].Config
	d.progressf("%s: PyTorch runs with %s\n", label, choice.Chosen)
	return choice, nil
}

// failure is why a run failed, short enough for the page: how the program exited, when it did.
func failure(err error) string {
	if exit := new(exec.ExitError); errors.As(err, &exit) {
		return exit.String()
	}
	return firstLine(err.Error())
}

// pytorchCommand runs a PyTorch twin: script on procs processes in configuration cfg, with the job's flags.
func (d *driver) pytorchCommand(ctx context.Context, script string, procs int, cfg torchConfig, job []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.endToEnd.python, append([]string{script, "--procs", strconv.Itoa(procs),
		"--threads", strconv.Itoa(max(cfg.Threads, 1))}, job...)...)
	if cfg.UnsetCoreType {
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, openBLASCoreType+"=")
		})
	}
	return cmd
}

// torchConfigOf is the configuration a PyTorch row runs: the chosen one, or, without a choice, cores /
// processes threads.
func (d *driver) torchConfigOf(choice *torchChoice, procs int) torchConfig {
	if choice != nil {
		return choice.Chosen
	}
	return torchCandidates(d.cores(), procs, "")[0]
}

// labelledChoice is a PyTorch row's configuration choice with the row's name on the page.
type labelledChoice struct {
	row    string
	choice *torchChoice
}

// torchChoices writes, under a section's table, how each PyTorch row's configuration was chosen: every
// candidate with its calibration figures (unit: "examples/s", "tokens/s"), and which won; job says what a
// calibration run trains ("8192 training examples"), and judged whether the section has goals.
func (r *reporter) torchChoices(unit, job string, judged bool, rows []labelledChoice) {
	rows = slices.DeleteFunc(slices.Clone(rows), func(l labelledChoice) bool { return l.choice == nil })
	if len(rows) == 0 {
		return
	}
	first := rows[0].choice
	r.p("**PyTorch's configuration.** Each PyTorch row runs PyTorch's fastest configuration on this machine. " +
		"The candidates are 1 to cores / processes threads per process")
	if first.CoreType != "" {
		r.p(", each with `%s=%s` as the environment sets it (goaccel runs with it) and without it. A candidate "+
			"without it is eligible only when its %s is within %s of that of the run with it on the same threads.",
			openBLASCoreType, first.CoreType, first.Check.Name, first.Check.tolerance())
	} else {
		r.p("; `%s` is not set in the environment, so there is no run without it to compare.", openBLASCoreType)
	}
	rounds := 0
	for _, l := range rows {
		rounds = max(rounds, l.choice.Rounds)
	}
	if rounds > 0 {
		r.p(" Before the rounds above, each candidate trained %d time(s) on a shorter job (%s), interleaved, and "+
			"the fastest eligible one (median) ran the row", rounds, job)
		if judged {
			r.p(": goals are judged against it")
		}
		r.p(".\n\n")
	} else {
		r.p(" Without calibration rounds the rows ran with cores / processes threads.\n\n")
	}
	var table [][]string
	for _, l := range rows {
		c := l.choice
		if len(c.Cands) == 0 {
			why := "the only candidate"
			if !c.Only {
				why = "not calibrated"
			}
			table = append(table, []string{l.row, c.Chosen.String(), "—", "—", fmt.Sprintf("**chosen** (%s)", why)})
			continue
		}
		for _, cand := range c.Cands {
			rate, quality := "—", "—"
			if len(cand.PerUnit.Seconds) > 0 {
				rate = rateCell(cand.PerUnit)
				quality = c.Check.show(quantile(cand.Quality, 0.5))
			}
			verdict := ""
			switch {
			case cand.Config == c.Chosen:
				verdict = "**chosen**"
			case !cand.Eligible:
				verdict = "not eligible: " + cand.Why
			}
			table = append(table, []string{l.row, cand.Config.String(), rate, quality, verdict})
		}
	}
	r.table([]string{"PyTorch row", "Candidate", ">Calibration " + unit, ">Calibration " + first.Check.Name, "Outcome"}, table)
}
