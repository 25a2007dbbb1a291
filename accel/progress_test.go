package accel_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
)

// countTo adds one step at a time up to n.
func countTo(p *accel.Progress, n int) {
	for range n {
		p.Add(1)
	}
}

// TestProgressIsQuietWithoutATerminal: output to a buffer or a regular file draws nothing.
func TestProgressIsQuietWithoutATerminal(t *testing.T) {
	var buf bytes.Buffer
	acc := newSingle(t, accel.WithOutput(&buf))
	p := acc.Progress(5, accel.ProgressDescription("epoch 1"))
	assert.False(t, p.Visible())
	countTo(p, 5)
	p.Describe("epoch 1 loss 0.5")
	p.Close()
	assert.Empty(t, buf.String())

	f, err := os.Create(filepath.Join(t.TempDir(), "log.txt"))
	require.NoError(t, err)
	defer f.Close()
	acc = newSingle(t, accel.WithOutput(f))
	p = acc.Progress(5)
	assert.False(t, p.Visible())
	countTo(p, 5)
	p.Close()
	info, err := f.Stat()
	require.NoError(t, err)
	assert.Zero(t, info.Size())
}

// Drawn bars: description, percentage, bar, count, rate and [elapsed:left] while running, [elapsed] at
// the end.
var (
	barRunning = regexp.MustCompile(`epoch 1 +75% \|[^|]+\| \(3/4, \d+ batches/(s|min|hr)\) \[\d+\w*:\d+\w*\]`)
	barDone    = regexp.MustCompile(`epoch 1 100% \|[^|]+\| \(4/4, \d+ batches/(s|min|hr)\) \[\d+\w*\]`)
)

// countSlowly counts to 4, pausing before the third step so that it is drawn (redraws are throttled).
func countSlowly(p *accel.Progress) {
	countTo(p, 2)
	time.Sleep(150 * time.Millisecond)
	countTo(p, 2)
}

// TestProgressForcedDrawsABarWithRate: forced on, the bar is drawn, reaches its total with a rate and a
// time left, and ends its line once.
func TestProgressForcedDrawsABarWithRate(t *testing.T) {
	var buf bytes.Buffer
	acc := newSingle(t, accel.WithOutput(&buf))
	p := acc.Progress(4, accel.ProgressVisible(true), accel.ProgressDescription("epoch 1"),
		accel.ProgressUnit("batches"))
	require.True(t, p.Visible())
	countSlowly(p)
	p.Close()
	p.Close()
	out := buf.String()
	assert.Regexp(t, barRunning, out)
	assert.Regexp(t, barDone, out)
	assert.True(t, strings.HasSuffix(out, "\n") && !strings.HasSuffix(out, "\n\n"), "one line end: %q", out)

	// Closed early: the line ends where the bar stands.
	buf.Reset()
	p = acc.Progress(10, accel.ProgressVisible(true))
	countTo(p, 3)
	p.Close()
	p.Add(1) // after Close: nothing
	assert.Contains(t, buf.String(), "/10")
	assert.NotContains(t, buf.String(), "100%")
	assert.Equal(t, 1, strings.Count(buf.String(), "\n"))

	// An unknown total (a stream): the count and the rate, no bar.
	buf.Reset()
	p = acc.Progress(-1, accel.ProgressVisible(true))
	countTo(p, 3)
	p.Close()
	assert.Regexp(t, `\(3/-, \d+ it/(s|min|hr)\)`, buf.String())
	assert.NotContains(t, buf.String(), "%")

	// Forced off: nothing, even on a terminal.
	buf.Reset()
	p = acc.Progress(3, accel.ProgressVisible(false))
	assert.False(t, p.Visible())
	countTo(p, 3)
	p.Close()
	assert.Empty(t, buf.String())
}

// TestProgressOnlyOnTheMainProcess: with the bar forced on, rank 0 draws it and rank 1 writes nothing.
func TestProgressOnlyOnTheMainProcess(t *testing.T) {
	outs := make([]bytes.Buffer, 2)
	visible := make([]bool, 2)
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			acc, err := accel.New(accel.WithCommunicator(comms[rank]), accel.WithBackend("go"),
				accel.WithOutput(&outs[rank]))
			if err != nil {
				errs[rank] = err
				return
			}
			p := acc.Progress(4, accel.ProgressVisible(true), accel.ProgressDescription("epoch 1"),
				accel.ProgressUnit("batches"))
			visible[rank] = p.Visible()
			countSlowly(p)
			p.Close()
			errs[rank] = acc.Close()
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	assert.Equal(t, []bool{true, false}, visible)
	assert.Regexp(t, barRunning, outs[0].String())
	assert.Regexp(t, barDone, outs[0].String())
	assert.Empty(t, outs[1].String())
}

// TestProgressBatches: Batches yields every batch, counts each, and stops when the loop breaks.
func TestProgressBatches(t *testing.T) {
	var buf bytes.Buffer
	acc := newSingle(t, accel.WithOutput(&buf))
	loader := loaderFor(t, acc, 12, 3)
	p := acc.Progress(loader.Len(), accel.ProgressVisible(true), accel.ProgressUnit("batches"))
	n := 0
	for _, err := range p.Batches(loader.All()) {
		require.NoError(t, err)
		n++
	}
	assert.Equal(t, 4, n)
	assert.Contains(t, buf.String(), "(4/4, ")

	buf.Reset()
	p = acc.Progress(loader.Len(), accel.ProgressVisible(true))
	for range p.Batches(loader.All()) {
		break // the first batch is not counted: its body did not finish
	}
	p.Close()
	assert.Contains(t, buf.String(), "(0/4, ")
	assert.NotContains(t, buf.String(), "(1/4, ")
}

// Progress draws on the main process only, and only on a terminal: under `go test` the output is not
// one, so the bar stays silent and the loop runs unchanged.
func ExampleAccelerator_Progress() {
	acc, _ := accel.New()
	defer acc.Close()
	loader, _ := acc.PrepareDataLoader(lineData(16), accel.BatchSize(4))
	bar := acc.Progress(loader.Len(), accel.ProgressDescription("epoch 1"), accel.ProgressUnit("batches"))
	defer bar.Close()
	batches := 0
	for _, err := range bar.Batches(loader.All()) {
		if err != nil {
			fmt.Println(err)
			return
		}
		batches++ // the training step
		bar.Describe(fmt.Sprintf("epoch 1 batch %d", batches))
	}
	fmt.Println("drawn:", bar.Visible(), "batches:", batches)
	// Output:
	// drawn: false batches: 4
}

// ProgressVisible(true) draws the bar whatever the output: here into a buffer, to show its last state.
func ExampleProgressVisible() {
	var out bytes.Buffer
	acc, _ := accel.New(accel.WithOutput(&out))
	defer acc.Close()
	bar := acc.Progress(3, accel.ProgressVisible(true), accel.ProgressDescription("epoch 1"),
		accel.ProgressUnit("batches"))
	for range 3 {
		bar.Add(1)
	}
	bar.Close()
	frames := strings.Split(strings.TrimSpace(out.String()), "\r")
	last := frames[len(frames)-1]
	fmt.Println(strings.TrimSpace(last[:strings.Index(last, "(")]))
	fmt.Println(regexp.MustCompile(`\(3/3, \d+ batches/s\)`).MatchString(last))
	// Output:
	// epoch 1 100% |██████████████████████████████|
	// true
}

// ProgressDescription and ProgressUnit label the bar: the text left of it and the unit of its rate.
func ExampleProgressDescription() {
	var out bytes.Buffer
	acc, _ := accel.New(accel.WithOutput(&out))
	defer acc.Close()
	bar := acc.Progress(2, accel.ProgressVisible(true), accel.ProgressDescription("eval"),
		accel.ProgressUnit("images"))
	bar.Add(2)
	fmt.Println(strings.Contains(out.String(), "eval 100%"), strings.Contains(out.String(), " images/"))
	// Output:
	// true true
}

// ProgressUnit names what the rate counts.
func ExampleProgressUnit() {
	var out bytes.Buffer
	acc, _ := accel.New(accel.WithOutput(&out))
	defer acc.Close()
	bar := acc.Progress(1, accel.ProgressVisible(true), accel.ProgressUnit("steps"))
	bar.Add(1)
	fmt.Println(regexp.MustCompile(`\(1/1, \d+ steps/s\)`).MatchString(out.String()))
	// Output:
	// true
}
