package accel

import (
	"io"
	"iter"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/goaccel/goaccel/prepare"
)

// Progress is a progress bar drawn by the main process (Accelerate's tqdm with
// disable=not accelerator.is_main_process): the count, a bar, the rate and the time left, redrawn in place
// at most every tenth of a second. It is drawn only where that reads well, and is otherwise silent: see
// Accelerator.Progress. Its methods do nothing on a bar that is not drawn, so every process runs the same
// code.
type Progress struct {
	bar *progressbar.ProgressBar // nil when the bar is not drawn
	w   io.Writer

	// mu serialises the calls into bar, and so the line end that it runs on completion (endLine).
	mu       sync.Mutex
	lineDone bool
}

// ProgressOption configures a Progress bar.
type ProgressOption func(*progressConfig)

type progressConfig struct {
	description string
	unit        string
	visible     *bool
}

// ProgressDescription sets the text left of the bar (Describe changes it later).
func ProgressDescription(text string) ProgressOption {
	return func(c *progressConfig) { c.description = text }
}

// ProgressUnit names what the bar counts, in its rate: "12 batches/s" (default "it", as tqdm).
func ProgressUnit(unit string) ProgressOption { return func(c *progressConfig) { c.unit = unit } }

// ProgressVisible overrides the terminal test: true draws the bar on the main process whatever its output
// (a log file gets each redraw), false never draws it. Other processes never draw.
func ProgressVisible(visible bool) ProgressOption {
	return func(c *progressConfig) { c.visible = &visible }
}

// progressRedraw is the shortest time between two redraws: faster gains the eye nothing and costs writes.
const progressRedraw = 100 * time.Millisecond

// Progress starts a progress bar of total steps (0 or less: unknown, a count and a rate without bar) on
// the accelerator's output (WithOutput). It is drawn only on the main process, and only when that output
// is a terminal and the job is a single process: mpirun hands each process a pseudo-terminal even when its
// own output goes to a file, which a bar redrawn every tenth of a second would fill. ProgressVisible(true)
// draws it anyway (on the main process), ProgressVisible(false) never.
//
// Count with Add, or let Batches count a loader's batches; Close ends the bar's line. A bar that reaches
// total ends its line itself. For an epoch resumed from a checkpoint, give the batches left,
// loader.Len()-loader.Position(), so that the rate and the time left count this run's batches only.
func (a *Accelerator) Progress(total int, opts ...ProgressOption) *Progress {
	cfg := progressConfig{unit: "it"}
	for _, opt := range opts {
		opt(&cfg)
	}
	p := &Progress{w: a.Output()}
	visible := a.WorldSize() == 1 && isTerminal(p.w)
	if cfg.visible != nil {
		visible = *cfg.visible
	}
	if !visible || !a.IsMainProcess() {
		return p
	}
	if total <= 0 {
		total = -1 // progressbar's unknown length
	}
	p.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(p.w),
		progressbar.OptionSetDescription(cfg.description),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(cfg.unit),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionThrottle(progressRedraw),
		progressbar.OptionSetWidth(30),
		// No spinner goroutine for an unknown length: the bar is redrawn by Add alone.
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionOnCompletion(p.endLine),
	)
	return p
}

// isTerminal reports whether w is a terminal, where a bar redrawn in place reads as one line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Visible reports whether this process draws the bar.
func (p *Progress) Visible() bool { return p.bar != nil }

// Add counts n more steps done.
func (p *Progress) Add(n int) {
	if p.bar == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.bar.Add(n) // a progress bar that cannot write must not stop the training
}

// Describe changes the text left of the bar: the epoch, a running loss.
func (p *Progress) Describe(text string) {
	if p.bar == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bar.Describe(text)
}

// Batches yields the batches of seq (a loader's All) and counts each once the loop's body is done with
// it, as tqdm wrapped around a loader does. It does not close the bar, which may span several epochs.
func (p *Progress) Batches(seq iter.Seq2[prepare.Batch, error]) iter.Seq2[prepare.Batch, error] {
	return func(yield func(prepare.Batch, error) bool) {
		for batch, err := range seq {
			if !yield(batch, err) {
				return
			}
			p.Add(1)
		}
	}
}

// Close draws the bar where it stands and ends its line, so that what is printed next starts a line of
// its own; later calls do nothing. A bar that reached its total ended its line already.
func (p *Progress) Close() {
	if p.bar == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.bar.IsFinished() && !p.lineDone {
		progressbar.OptionThrottle(0)(p.bar)
		_ = p.bar.Add(0) // the last count, which throttling may not have drawn
		_ = p.bar.Exit() // runs endLine
	}
	p.endLine()
}

// endLine ends the bar's line, once. It runs with p.mu held: from Close, or from the bar's completion
// inside Add.
func (p *Progress) endLine() {
	if p.lineDone {
		return
	}
	p.lineDone = true
	_, _ = io.WriteString(p.w, "\n")
}
