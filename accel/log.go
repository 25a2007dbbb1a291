package accel

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/replicas"
)

// Tracker records the metrics the main process logs with Accelerator.Log (Accelerate's trackers).
type Tracker interface {
	// Log records the metrics of step.
	Log(step int64, metrics map[string]float64) error
	// Resume is called by LoadState, before any Log: the tracker keeps its first records records — those
	// logged before the checkpoint — and drops later ones, which the resumed run logs again. A tracker that
	// is never resumed starts afresh.
	Resume(records int64) error
	// Close flushes and releases the tracker.
	Close() error
}

// WithTrackers sets where Log writes (on the main process). The accelerator closes them.
func WithTrackers(trackers ...Tracker) Option {
	return func(c *config) { c.trackers = append(c.trackers, trackers...) }
}

// LogOption configures one Log call.
type LogOption func(*logConfig)

type logConfig struct {
	meanOverRanks bool
	// weighted: WeightedBy(weight).
	weighted bool
	weight   float64
}

// MeanOverRanks logs each metric's mean over the ranks instead of the main process's own value (a loss
// over the whole global batch, not over the main process's shard). Log is then collective: every rank
// calls it for the same step with the same metric names, or every rank gets an error naming the names
// each rank gave. Every rank counts alike; when the ranks' values are means over different numbers of
// examples, WeightedBy gives the mean over the examples.
func MeanOverRanks() LogOption { return func(c *logConfig) { c.meanOverRanks = true } }

// WeightedBy logs each metric's mean over the ranks weighted by weight, this rank's number of examples
// behind its values: Σ value·weight / Σ weight, the mean over every example of the ranks when each value is
// a mean over the rank's examples (a loss averaged over batches of unequal sizes, or over a different
// number of them on each rank). Log is collective as with MeanOverRanks, which WeightedBy replaces. A
// rank of weight 0 contributes nothing, even a NaN; weights that are negative, or that sum to 0 over the
// ranks, are an error on every rank. See WeightedMean for one value outside Log.
func WeightedBy(weight float64) LogOption {
	return func(c *logConfig) { c.weighted, c.weight = true, weight }
}

// Log records metrics for step on the main process's trackers (WithTrackers); other processes do nothing
// (with MeanOverRanks or WeightedBy they contribute their values). A checkpoint remembers how many records were logged
// before it, and a run resumed from it drops the later ones, so that the logs hold no duplicate rows after
// a resume.
func (a *Accelerator) Log(step int64, metrics map[string]float64, opts ...LogOption) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if len(metrics) == 0 {
		return fmt.Errorf("accel: log: no metrics for step %d", step)
	}
	var cfg logConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	switch {
	case cfg.weighted:
		mean, err := a.weightedMeans(step, metrics, cfg.weight)
		if err != nil {
			return err
		}
		metrics = mean
	case cfg.meanOverRanks && a.WorldSize() > 1:
		mean, err := a.meanOverRanks(step, metrics)
		if err != nil {
			return err
		}
		metrics = mean
	}
	if !a.IsMainProcess() {
		return nil
	}
	for _, t := range a.cfg.trackers {
		if err := t.Log(step, metrics); err != nil {
			return fmt.Errorf("accel: log step %d: %w", step, err)
		}
	}
	a.logRecords++
	return nil
}

// resumeTrackers drops the records a resumed run will write again: those logged after the checkpoint.
func (a *Accelerator) resumeTrackers(records int64) error {
	a.logRecords = records
	if !a.IsMainProcess() {
		return nil
	}
	for _, t := range a.cfg.trackers {
		if err := t.Resume(records); err != nil {
			return fmt.Errorf("accel: resuming a tracker: %w", err)
		}
	}
	return nil
}

func (a *Accelerator) closeTrackers() error {
	if !a.IsMainProcess() {
		return nil // only the main process logs (and resumes), so only it opened the trackers
	}
	var errs []error
	for _, t := range a.cfg.trackers {
		errs = append(errs, t.Close())
	}
	return errors.Join(errs...)
}

// fileTracker is what the JSON Lines and CSV trackers share: a file written one record per line, created
// afresh on the first Log unless Resume kept its earlier records.
type fileTracker struct {
	path   string
	file   *os.File
	format interface {
		// header is the file's first line for these metrics (CSV), or nil.
		header(metrics map[string]float64) ([]byte, error)
		record(step int64, metrics map[string]float64) ([]byte, error)
		// isRecord tells a record line from a header line, and refuses lines of another format.
		isRecord(line []byte) (bool, error)
		// adopt learns the format's state (CSV's columns) from a kept header line.
		adopt(header []byte) error
	}
}

// NewJSONLinesTracker writes one JSON object per Log to path: {"step": 3, "loss": 0.25, …}. Non-finite
// values are written as null.
func NewJSONLinesTracker(path string) Tracker {
	return &fileTracker{path: path, format: jsonLines{}}
}

// NewCSVTracker writes a CSV table to path: a header "step,<metric>,…" with the metrics of the first Log,
// sorted by name, then one row per Log. A Log may leave metrics out (empty cells); one with new metrics
// adds their columns at the end, rewriting the file with empty cells in the earlier rows.
func NewCSVTracker(path string) Tracker {
	return &fileTracker{path: path, format: &csvFormat{}}
}

func (t *fileTracker) Log(step int64, metrics map[string]float64) error {
	if t.file == nil {
		if err := t.open(os.O_CREATE | os.O_TRUNC | os.O_WRONLY); err != nil {
			return err
		}
		header, err := t.format.header(metrics)
		if err != nil {
			return err
		}
		if _, err := t.file.Write(header); err != nil {
			return fmt.Errorf("writing %s: %w", t.path, err)
		}
	}
	line, err := t.format.record(step, metrics)
	if cf, ok := t.format.(*csvFormat); ok && errors.Is(err, errNewColumns) {
		if err := t.widen(cf, metrics); err != nil {
			return err
		}
		line, err = t.format.record(step, metrics)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", t.path, err)
	}
	if _, err := t.file.Write(line); err != nil {
		return fmt.Errorf("writing %s: %w", t.path, err)
	}
	return nil
}

func (t *fileTracker) open(flags int) error {
	if err := os.MkdirAll(filepath.Dir(t.path), 0o755); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	f, err := os.OpenFile(t.path, flags, 0o644)
	if err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	t.file = f
	return nil
}

// Resume rewrites the file with its first records records (atomically: a crash leaves the old file or
// the new one) and appends from there.
func (t *fileTracker) Resume(records int64) error {
	if t.file != nil {
		return fmt.Errorf("tracker %s: Resume after Log", t.path)
	}
	data, err := os.ReadFile(t.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	var kept bytes.Buffer
	for seen := int64(0); len(data) > 0; {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i+1], data[i+1:]
		} else {
			data = nil // a last line without newline was cut by a crash: drop it
			break
		}
		isRecord, err := t.format.isRecord(bytes.TrimSuffix(line, []byte("\n")))
		if err != nil {
			return fmt.Errorf("tracker %s: %w", t.path, err)
		}
		if !isRecord {
			if err := t.format.adopt(line); err != nil {
				return fmt.Errorf("tracker %s: %w", t.path, err)
			}
		}
		if !isRecord || seen < records {
			kept.Write(line)
		}
		if isRecord {
			seen++
		}
	}
	tmp := t.path + ".tmp"
	if err := os.WriteFile(tmp, kept.Bytes(), 0o644); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	if err := os.Rename(tmp, t.path); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	if err := t.open(os.O_APPEND | os.O_WRONLY); err != nil {
		return err
	}
	if kept.Len() == 0 {
		// Nothing kept, not even a header: the first Log writes it.
		_ = t.file.Close()
		t.file = nil
	}
	return nil
}

// widen adds the metrics' new names as CSV columns, rewriting the file's earlier rows with empty cells.
func (t *fileTracker) widen(cf *csvFormat, metrics map[string]float64) error {
	if err := t.file.Close(); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	t.file = nil
	f, err := os.Open(t.path)
	if err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	records, err := csv.NewReader(f).ReadAll()
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("tracker %s: %w", t.path, err)
	}
	for _, name := range sortedNames(metrics) {
		if !slices.Contains(cf.columns, name) {
			cf.columns = append(cf.columns, name)
		}
	}
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	_ = w.Write(append([]string{"step"}, cf.columns...))
	for _, rec := range records[1:] {
		for len(rec) < len(cf.columns)+1 {
			rec = append(rec, "")
		}
		_ = w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	tmp := t.path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	if err := os.Rename(tmp, t.path); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	return t.open(os.O_APPEND | os.O_WRONLY)
}

func (t *fileTracker) Close() error {
	if t.file == nil {
		return nil
	}
	err := t.file.Close()
	t.file = nil
	return err
}

type jsonLines struct{}

func (jsonLines) header(map[string]float64) ([]byte, error) { return nil, nil }

func (jsonLines) adopt([]byte) error { return nil }

func (jsonLines) record(step int64, metrics map[string]float64) ([]byte, error) {
	var b strings.Builder
	b.WriteString(`{"step":`)
	b.WriteString(strconv.FormatInt(step, 10))
	for _, name := range sortedNames(metrics) {
		key, err := json.Marshal(name)
		if err != nil {
			return nil, err
		}
		b.WriteByte(',')
		b.Write(key)
		b.WriteByte(':')
		b.WriteString(jsonNumber(metrics[name]))
	}
	b.WriteString("}\n")
	return []byte(b.String()), nil
}

func (jsonLines) isRecord(line []byte) (bool, error) {
	var rec struct {
		Step *int64 `json:"step"`
	}
	if err := json.Unmarshal(line, &rec); err != nil || rec.Step == nil {
		return false, fmt.Errorf("line %q is not a record with a step", line)
	}
	return true, nil
}

func jsonNumber(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "null"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

type csvFormat struct{ columns []string }

// errNewColumns tells the tracker to widen the CSV before writing the record.
var errNewColumns = errors.New("the record has metrics that are not columns yet")

func (c *csvFormat) header(metrics map[string]float64) ([]byte, error) {
	c.columns = sortedNames(metrics)
	return csvLine(append([]string{"step"}, c.columns...))
}

func (c *csvFormat) adopt(header []byte) error {
	rec, err := csv.NewReader(bytes.NewReader(header)).Read()
	if err != nil || len(rec) == 0 || rec[0] != "step" {
		return fmt.Errorf("header %q does not start with step", header)
	}
	c.columns = rec[1:]
	return nil
}

func (c *csvFormat) record(step int64, metrics map[string]float64) ([]byte, error) {
	row := []string{strconv.FormatInt(step, 10)}
	for _, name := range c.columns {
		cell := ""
		if v, ok := metrics[name]; ok {
			cell = strconv.FormatFloat(v, 'g', -1, 64)
		}
		row = append(row, cell)
	}
	for name := range metrics {
		if !slices.Contains(c.columns, name) {
			return nil, errNewColumns
		}
	}
	return csvLine(row)
}

func (c *csvFormat) isRecord(line []byte) (bool, error) {
	rec, err := csv.NewReader(bytes.NewReader(line)).Read()
	if err != nil || len(rec) == 0 {
		return false, fmt.Errorf("line %q is not CSV", line)
	}
	if rec[0] == "step" {
		return false, nil
	}
	if _, err := strconv.ParseInt(rec[0], 10, 64); err != nil {
		return false, fmt.Errorf("line %q does not start with a step", line)
	}
	return true, nil
}

func csvLine(fields []string) ([]byte, error) {
	var buf bytes.Buffer
	w := csv.NewWriter(bufio.NewWriter(&buf))
	if err := w.Write(fields); err != nil {
		return nil, err
	}
	w.Flush()
	return buf.Bytes(), w.Error()
}

func sortedNames(metrics map[string]float64) []string {
	names := make([]string, 0, len(metrics))
	for name := range metrics {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// meanOverRanks averages metrics over the ranks, after checking that every rank logs the same names for
// the same step (the values travel in name order, so different names would mix up metrics).
func (a *Accelerator) meanOverRanks(step int64, metrics map[string]float64) (map[string]float64, error) {
	names, err := a.sameMetricNames(step, metrics, "MeanOverRanks")
	if err != nil {
		return nil, err
	}
	sums := make([]float64, len(names))
	for i, name := range names {
		sums[i] = metrics[name]
	}
	if err := a.comm.AllReduceSum(backends.BufferOf(sums)); err != nil {
		return nil, fmt.Errorf("accel: log step %d: averaging over ranks: %w", step, err)
	}
	mean := make(map[string]float64, len(names))
	for i, name := range names {
		mean[name] = sums[i] / float64(a.WorldSize())
	}
	return mean, nil
}

// sameMetricNames returns the metrics' names in order, once every rank is known to log the same ones for
// step.
func (a *Accelerator) sameMetricNames(step int64, metrics map[string]float64, option string) ([]string, error) {
	names := slices.Sorted(maps.Keys(metrics))
	if a.WorldSize() == 1 {
		return names, nil
	}
	same := []replicas.Setting{{Name: "what Log(" + option + ") records", Value: fmt.Sprintf("step %d: %s", step,
		strings.Join(names, ", "))}}
	if err := replicas.CheckSameSettings(a.comm, same); err != nil {
		return nil, fmt.Errorf("accel: log: %w", err)
	}
	return names, nil
}

// weightedMeans is Log's WeightedBy: each metric's mean over the ranks weighted by weight.
func (a *Accelerator) weightedMeans(step int64, metrics map[string]float64, weight float64) (map[string]float64, error) {
	names, err := a.sameMetricNames(step, metrics, "WeightedBy")
	if err != nil {
		return nil, err
	}
	values := make([]float64, len(names))
	for i, name := range names {
		values[i] = metrics[name]
	}
	means, total, err := a.weightedMeansOverRanks(values, weight)
	if err != nil {
		return nil, fmt.Errorf("accel: log step %d: %w", step, err)
	}
	if total == 0 {
		return nil, fmt.Errorf("accel: log step %d: the weights (WeightedBy) sum to 0 over the ranks: no example "+
			"to average", step)
	}
	mean := make(map[string]float64, len(names))
	for i, name := range names {
		mean[name] = means[i]
	}
	return mean, nil
}

// WeightedMean is the mean of value over every process, weighted by weight: Σ value·weight / Σ weight. When
// each process's value is a mean over its own examples (a loss averaged over the batches it trained) and
// weight is their number, it is the mean over every example of the job, which a plain mean over processes
// or over batches is not once batches differ in size: the last, short batch of an epoch, or batches of
// another size after a run resumed on another number of processes. totalWeight is Σ weight. Weights are
// meant to be positive: a process of weight 0 contributes nothing, even a NaN value; when the weights sum
// to 0, mean is NaN.
//
// Collective: every process calls it, with one value (one all-reduce of two numbers); a negative weight is
// an error on every process. For metrics logged with Log, WeightedBy does the same.
func (a *Accelerator) WeightedMean(value, weight float64) (mean, totalWeight float64, err error) {
	if err := a.checkOpen(); err != nil {
		return 0, 0, err
	}
	means, total, err := a.weightedMeansOverRanks([]float64{value}, weight)
	if err != nil {
		return 0, 0, fmt.Errorf("accel: weighted mean: %w", err)
	}
	return means[0], total, nil
}

// weightedMeansOverRanks all-reduces Σ value·weight for each value, Σ weight and the number of negative
// weights in one call, and returns the weighted means (NaN when the weights sum to 0) and Σ weight. A
// negative weight on any rank is an error on every rank.
func (a *Accelerator) weightedMeansOverRanks(values []float64, weight float64) ([]float64, float64, error) {
	sums := make([]float64, len(values)+2)
	if weight != 0 {
		for i, v := range values {
			sums[i] = v * weight
		}
	}
	sums[len(values)] = weight
	if weight < 0 || math.IsNaN(weight) {
		sums[len(values)+1] = 1
	}
	if a.WorldSize() > 1 {
		if err := a.comm.AllReduceSum(backends.BufferOf(sums)); err != nil {
			return nil, 0, fmt.Errorf("summing over the ranks: %w", err)
		}
	}
	if negative := sums[len(values)+1]; negative > 0 {
		return nil, 0, fmt.Errorf("%g rank(s) gave a negative or NaN weight: weights count examples", negative)
	}
	total := sums[len(values)]
	means := make([]float64, len(values))
	for i := range values {
		means[i] = math.NaN()
		if total != 0 {
			means[i] = sums[i] / total
		}
	}
	return means, total, nil
}
