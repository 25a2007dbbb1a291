package accel_test

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/jobenv"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/internal/traceevent"
)

// timelineRun is what a rank of a timeline test did, for the checks of its timeline.
type timelineRun struct {
	MicroBatches int64 `json:"micro_batches"`
	Steps        int64 `json:"steps"`
	Syncs        int64 `json:"syncs"`
	Buckets      int   `json:"buckets"`
	Saves        int   `json:"saves"`
	Loads        int   `json:"loads"`
	// Weights are the trained parameters, bit by bit.
	Weights map[string][]uint32 `json:"weights"`
}

// timelineOptions are the options of a timeline test's accelerator: two micro-batches per optimizer step,
// and buckets small enough that the MLP has several.
var timelineOptions = []accel.Option{accel.WithBackend("go"), accel.WithGradientAccumulationSteps(2), accel.WithBucketCapMB(0.0001)}

// timelineTrain trains the test MLP on acc (made with timelineOptions) for steps optimizer steps, then
// saves a checkpoint into dir and loads it back: every kind of event a timeline holds.
func timelineTrain(acc *accel.Accelerator, dir string, steps int) (timelineRun, error) {
	const batch, k = 2, 2
	inputs, labels := testmodel.Data(acc.WorldSize()*k*batch*steps, 5)
	res, err := testmodel.Run{Kind: testmodel.Adam, Inputs: inputs, Labels: labels, BatchSize: batch}.Train(acc)
	if err != nil {
		return timelineRun{}, err
	}
	run := timelineRun{Steps: res.Steps, Buckets: len(res.Model.Plan().Buckets), Weights: map[string][]uint32{}}
	s := acc.Stats()
	run.MicroBatches, run.Syncs = s.MicroBatches, s.Syncs
	if dir != "" {
		saved, err := acc.SaveState(dir)
		if err != nil {
			return run, err
		}
		run.Saves++
		if err := acc.LoadState(saved); err != nil {
			return run, err
		}
		run.Loads++
	}
	for _, v := range res.Model.Parameters() {
		values, err := testmodel.FlatFloat64(v)
		if err != nil {
			return run, err
		}
		bits := make([]uint32, len(values))
		for i, x := range values {
			bits[i] = math.Float32bits(float32(x))
		}
		run.Weights[v.ScopeAndName()] = bits
	}
	return run, nil
}

var (
	forwardBackwardName = regexp.MustCompile(`^forward\+backward (\d+)$`)
	microBatchName      = regexp.MustCompile(`^micro-batch (\d+)( \(syncs\))?$`)
	bucketName          = regexp.MustCompile(`^all-reduce bucket (\d+) \(`)
	optimizerStepName   = regexp.MustCompile(`^optimizer step (\d+)$`)
)

// checkTimeline checks a merged timeline against what each rank did: a row per rank; per micro-batch one
// forward and backward pass inside its micro-batch, the syncing ones marked; per sync one all-reduce per
// bucket on that bucket's track, and a wait for it on the training track; every optimizer step; the
// saves, loads and loaded batches; and, the ranks' clocks aligned, each collective on rank r overlapping
// the same collective on rank 0, as a collective completes on no rank before every rank started it.
func checkTimeline(t *testing.T, f traceevent.File, runs []timelineRun) {
	t.Helper()
	type key struct {
		pid  int
		name string
	}
	count := map[key]int{}
	slicesOf := map[key][]traceevent.Event{}
	names := map[int]string{}
	threads := map[[2]int]string{}
	for _, e := range f.TraceEvents {
		switch e.Ph {
		case traceevent.PhaseMetadata:
			if e.Name == "process_name" {
				names[e.Pid] = fmt.Sprint(e.Args["name"])
			}
			if e.Name == "thread_name" {
				threads[[2]int{e.Pid, e.Tid}] = fmt.Sprint(e.Args["name"])
			}
		case traceevent.PhaseComplete:
			require.GreaterOrEqual(t, e.Ts, 0.0, "%s", e.Name)
			require.GreaterOrEqual(t, e.Dur, 0.0, "%s", e.Name)
			k := key{e.Pid, e.Name}
			count[k]++
			slicesOf[k] = append(slicesOf[k], e)
		}
	}
	clockError := 0.0
	for r := range runs {
		if c, ok := f.OtherData[fmt.Sprintf("rank %d clock", r)].(map[string]any); ok {
			if e, ok := c["error_us"].(float64); ok {
				clockError = max(clockError, e)
			}
		}
	}
	for r, run := range runs {
		assert.Equal(t, fmt.Sprintf("rank %d", r), names[r], "rank %d's row", r)
		syncing := 0
		for i := int64(1); i <= run.MicroBatches; i++ {
			pass := slicesOf[key{r, fmt.Sprintf("forward+backward %d", i)}]
			require.Len(t, pass, 1, "rank %d: one forward and backward pass of micro-batch %d", r, i)
			outer := append(slicesOf[key{r, fmt.Sprintf("micro-batch %d", i)}], slicesOf[key{r, fmt.Sprintf("micro-batch %d (syncs)", i)}]...)
			require.Len(t, outer, 1, "rank %d: micro-batch %d", r, i)
			assert.True(t, outer[0].Ts <= pass[0].Ts && pass[0].End() <= outer[0].End()+1e-3,
				"rank %d: micro-batch %d's pass is inside it", r, i)
			assert.Equal(t, pass[0].Args["syncs"], outer[0].Args["syncs"])
			if strings.HasSuffix(outer[0].Name, "(syncs)") {
				syncing++
			}
		}
		assert.EqualValues(t, run.Syncs, syncing, "rank %d: the micro-batches that sync say so", r)
		for s := int64(1); s <= run.Steps; s++ {
			assert.Equal(t, 1, count[key{r, fmt.Sprintf("optimizer step %d", s)}], "rank %d: optimizer step %d", r, s)
		}
		assert.Equal(t, run.Saves, count[key{r, "save checkpoint"}], "rank %d: saves", r)
		assert.Equal(t, run.Loads, count[key{r, "load checkpoint"}], "rank %d: loads", r)
		loads := 0
		for k, n := range count {
			if k.pid == r && strings.HasPrefix(k.name, "load batch (") {
				loads += n
			}
		}
		assert.Positive(t, loads, "rank %d: the loader's batches", r)
		if len(runs) == 1 {
			continue
		}
		for b := range run.Buckets {
			var collectives, waits int
			for k, evs := range slicesOf {
				if k.pid != r {
					continue
				}
				if m := bucketName.FindStringSubmatch(k.name); m != nil && m[1] == strconv.Itoa(b) {
					collectives += len(evs)
					for _, e := range evs {
						assert.Equal(t, fmt.Sprintf("bucket %d", b), threads[[2]int{r, e.Tid}], "bucket %d's own track", b)
					}
				}
				if strings.HasPrefix(k.name, "wait ") && bucketName.MatchString(strings.TrimPrefix(k.name, "wait ")) &&
					bucketName.FindStringSubmatch(strings.TrimPrefix(k.name, "wait "))[1] == strconv.Itoa(b) {
					waits += len(evs)
				}
			}
			assert.EqualValues(t, run.Syncs, collectives, "rank %d: one all-reduce of bucket %d per sync", r, b)
			assert.EqualValues(t, run.Syncs, waits, "rank %d: one wait for bucket %d per sync", r, b)
		}
	}
	if len(runs) < 2 {
		return
	}
	// The same collective on two ranks: the i-th all-reduce of bucket b.
	for k, evs := range slicesOf {
		if k.pid != 0 || !bucketName.MatchString(k.name) {
			continue
		}
		for r := 1; r < len(runs); r++ {
			other := slicesOf[key{r, k.name}]
			require.Len(t, other, len(evs), "%s on rank %d", k.name, r)
			for i, e := range evs {
				o := other[i]
				assert.True(t, o.Ts <= e.End()+clockError && e.Ts <= o.End()+clockError,
					"%s #%d: rank %d's [%.1f, %.1f] µs and rank 0's [%.1f, %.1f] µs overlap (clock error %.1f µs)",
					k.name, i, r, o.Ts, o.End(), e.Ts, e.End(), clockError)
			}
		}
	}
}

// TestTimelineOnTwoRanks: two ranks in one process train with the timeline on; the merged file holds both
// ranks' rows with every event, and the weights are bit for bit those of the same run without it.
func TestTimelineOnTwoRanks(t *testing.T) {
	const steps = 4
	dir := t.TempDir()
	path := filepath.Join(dir, "timeline.json")
	train := func(opts []accel.Option, checkpoints string) []timelineRun {
		runs := make([]timelineRun, 2)
		runRanks(t, 2, append(opts, timelineOptions...), func(rank int, acc *accel.Accelerator) error {
			var err error
			runs[rank], err = timelineTrain(acc, checkpoints, steps)
			return err
		})
		return runs
	}
	on := train([]accel.Option{accel.WithTimeline(path)}, filepath.Join(dir, "ckpt"))
	off := train(nil, "")
	for r := range 2 {
		assert.Equal(t, off[r].Weights, on[r].Weights, "rank %d: the timeline changes no weight, bit for bit", r)
		assert.EqualValues(t, steps, on[r].Steps)
		assert.Greater(t, on[r].Buckets, 1, "small buckets: several per sync")
	}
	f, err := traceevent.ReadFile(path)
	require.NoError(t, err)
	checkTimeline(t, f, on)
	leftovers, err := filepath.Glob(filepath.Join(dir, ".timeline.json.*"))
	require.NoError(t, err)
	assert.Empty(t, leftovers, "the temporary file was renamed")
	_, err = os.Stat(path + ".rank-0.json")
	assert.True(t, os.IsNotExist(err), "merged: no rank's own file")
}

// TestTimelineOneProcess: on one process the environment variable turns the timeline on, a restarted
// job marks its start, and the file has the process's row.
func TestTimelineOneProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.json")
	t.Setenv(accel.TimelineEnvVar, path)
	t.Setenv(jobenv.RestartCount, "2")
	acc, err := accel.New(accel.WithBackend("go"))
	require.NoError(t, err)
	run, err := timelineTrain(acc, filepath.Join(t.TempDir(), "ckpt"), 3)
	require.NoError(t, err)
	require.NoError(t, acc.Close())
	f, err := traceevent.ReadFile(path)
	require.NoError(t, err)
	checkTimeline(t, f, []timelineRun{run})
	var restarts []string
	for _, e := range f.TraceEvents {
		if e.Ph == traceevent.PhaseInstant {
			restarts = append(restarts, e.Name)
		}
	}
	assert.Equal(t, []string{"restart 2"}, restarts)
}

// TestTimelineAfterAFailure: ranks whose communicator failed each write their own events.
func TestTimelineAfterAFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "failed.json")
	runRanks(t, 2, append([]accel.Option{accel.WithTimeline(path)}, timelineOptions...), func(rank int, acc *accel.Accelerator) error {
		_, err := timelineTrain(acc, "", 1)
		if err != nil {
			return err
		}
		acc.Communicator().Fail(fmt.Errorf("rank %d stops", rank))
		return nil
	})
	for r := range 2 {
		f, err := traceevent.ReadFile(fmt.Sprintf("%s.rank-%d.json", path, r))
		require.NoError(t, err, "rank %d's own file", r)
		var pids []int
		passes := 0
		for _, e := range f.TraceEvents {
			if e.Ph == traceevent.PhaseComplete {
				pids = append(pids, e.Pid)
				if forwardBackwardName.MatchString(e.Name) {
					passes++
				}
			}
		}
		assert.Subset(t, []int{r}, pids, "rank %d's file holds its own events", r)
		assert.Equal(t, 2, passes, "rank %d: K=2, one step", r)
	}
	_, err := os.Stat(path)
	assert.True(t, os.IsNotExist(err), "no merged file after a failure")
}
