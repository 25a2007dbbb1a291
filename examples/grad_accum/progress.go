package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/goaccel/goaccel/accel"
)

// progressMode says how training progress is shown.
type progressMode int

const (
	progressOff   progressMode = iota // other processes, or -quiet
	progressLines                     // a file, a pipe, or several processes: a plain line every quarter epoch
	progressBar                       // one process writing to a terminal: one line redrawn in place
)

// progress shows the main process's training progress with a running (exponentially averaged) loss.
// Only the main process draws: N processes redrawing the same terminal line through mpirun is noise.
//
// The terminal bar is github.com/schollz/progressbar/v3 (the library GoMLX's own bar uses; GoMLX's
// ui/commandline only attaches to a train.Loop, which a hand-written loop does not have).
type progress struct {
	w    io.Writer
	mode progressMode
	bar  *progressbar.ProgressBar

	epoch, epochs int
	batches, done int
	startDone     int     // batches done before this run's start of the epoch (a resumed epoch)
	loss          float64 // exponential moving average of the micro-batch losses
	lossSeen      bool
	start         time.Time
	nextQuarter   int // progressLines: the quarter of the epoch whose end prints the next line
}

// redrawEvery limits terminal redraws: faster than the eye gains nothing and costs write calls.
const redrawEvery = 150 * time.Millisecond

// barDescription is the text left of the bar: the epoch and the running loss.
func (p *progress) barDescription() string {
	if !p.lossSeen {
		return fmt.Sprintf("epoch %d/%d", p.epoch+1, p.epochs)
	}
	return fmt.Sprintf("epoch %d/%d loss %.4f", p.epoch+1, p.epochs, p.loss)
}

// lossSmoothing is the weight of the running loss: the bar shows a trend, not one batch's noise.
const lossSmoothing = 0.95

func newProgress(acc *accel.Accelerator, quiet bool, w io.Writer) *progress {
	p := &progress{w: w, mode: progressLines}
	switch {
	case quiet || !acc.IsMainProcess():
		p.mode = progressOff
	case acc.WorldSize() == 1 && isTerminal(w):
		// Only a single process trusts the test: mpirun hands its ranks a pseudo-terminal even when its own
		// output goes to a file, and a bar redrawn into a log is hundreds of kilobytes of noise.
		p.mode = progressBar
	}
	return p
}

// isTerminal reports whether w is a character device (a terminal), where \r redraws make sense.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// startEpoch begins an epoch of batches, of which done were trained before (a resumed epoch).
func (p *progress) startEpoch(epoch, epochs, batches, done int) {
	p.epoch, p.epochs, p.batches, p.done = epoch, epochs, batches, done
	p.start, p.startDone = time.Now(), done
	p.nextQuarter = 1
	for p.nextQuarter < 4 && done >= p.quarter(p.nextQuarter) {
		p.nextQuarter++
	}
	if p.mode == progressBar {
		p.bar = progressbar.NewOptions(batches,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription(p.barDescription()),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("batches"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(redrawEvery),
			progressbar.OptionSetWidth(30),
		)
		_ = p.bar.Add(done)
	}
}

// quarter is the batch count at the end of the i-th quarter of the epoch.
func (p *progress) quarter(i int) int { return max(1, (p.batches*i+3)/4) }

func (p *progress) update(loss float64) {
	if p.mode == progressOff {
		return
	}
	p.done++
	switch {
	case !p.lossSeen || math.IsNaN(p.loss) || math.IsInf(p.loss, 0):
		p.loss, p.lossSeen = loss, true
	default:
		p.loss = lossSmoothing*p.loss + (1-lossSmoothing)*loss
	}
	switch p.mode {
	case progressBar:
		p.bar.Describe(p.barDescription())
		_ = p.bar.Add(1)
	case progressLines:
		// Quarters 1 to 3 only: the end of the epoch gets the training loop's summary line.
		if p.nextQuarter < 4 && p.done >= p.quarter(p.nextQuarter) && p.done < p.batches {
			fmt.Fprintln(p.w, p.status(""))
			for p.nextQuarter < 4 && p.done >= p.quarter(p.nextQuarter) {
				p.nextQuarter++
			}
		}
	}
}

// endEpoch finishes the bar's line; the epoch's summary is printed by the training loop.
func (p *progress) endEpoch() {
	if p.mode == progressBar {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}

// status is one line: epoch, bar (if any), batches done, running loss, speed and time left.
func (p *progress) status(bar string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d/%d%s", p.epoch+1, p.epochs, bar)
	pct := 0
	if p.batches > 0 {
		pct = 100 * p.done / p.batches
	}
	fmt.Fprintf(&b, " %3d%% %d/%d batches", pct, p.done, p.batches)
	if p.lossSeen {
		fmt.Fprintf(&b, "  loss %.4f", p.loss)
	}
	if elapsed := time.Since(p.start); p.done > p.startDone && elapsed > 0 {
		rate := float64(p.done-p.startDone) / elapsed.Seconds()
		left := time.Duration(float64(p.batches-p.done) / rate * float64(time.Second))
		fmt.Fprintf(&b, "  %.1f batches/s  %s left", rate, left.Round(time.Second))
	}
	return b.String()
}
