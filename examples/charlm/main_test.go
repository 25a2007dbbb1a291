package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/prepare"
)

// writeCorpus writes n small Go files, in nested directories whose names sort differently as whole paths
// than directory by directory ("a-b" before "a/…"), and returns the root.
func writeCorpus(t *testing.T, n int) string {
	t.Helper()
	root := t.TempDir()
	for i := range n {
		dir := filepath.Join(root, []string{"a", "a-b", "c/d"}[i%3])
		require.NoError(t, os.MkdirAll(dir, 0o755))
		src := fmt.Sprintf("package p%d\n\n// F%d returns %d.\nfunc F%d() int {\n\treturn %d\n}\n", i, i, i, i, i*7)
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d.go", i)), []byte(src), 0o644))
	}
	// Not Go: never part of the corpus.
	require.NoError(t, os.WriteFile(filepath.Join(root, "a", "notes.txt"), []byte("not go"), 0o644))
	return root
}

// tinyCorpus is a repetitive corpus with enough text for a few steps of a tiny model.
func tinyCorpus(t *testing.T) string { return writeCorpus(t, 48) }

func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

var summaryKeys = []string{"goaccel_version", "rank", "world_size", "processes", "model", "context", "d_model", "heads", "blocks",
	"parameters", "batch_size", "accumulation_steps", "global_batch", "steps", "micro_batches", "syncs",
	"collective_calls", "collective_bytes", "comm_wait_seconds", "compute_seconds", "train_tokens",
	"train_examples", "final_loss", "validation_loss", "train_seconds", "tokens_per_second",
	"examples_per_second", "seconds"}

// parseSummary checks that the last stdout line is a JSON object with exactly the summary's keys.
func parseSummary(t *testing.T, stdout string) summary {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	line := lines[len(lines)-1]
	var keys map[string]any
	require.NoError(t, json.Unmarshal([]byte(line), &keys), "last line of stdout is not JSON: %q", line)
	var got []string
	for k := range keys {
		got = append(got, k)
	}
	require.ElementsMatch(t, summaryKeys, got)
	var s summary
	require.NoError(t, json.Unmarshal([]byte(line), &s))
	return s
}

func TestLoadCorpusIsDeterministicAndDisjoint(t *testing.T) {
	root := writeCorpus(t, 40)
	first, err := loadCorpus(root)
	require.NoError(t, err)
	again, err := loadCorpus(root)
	require.NoError(t, err)
	assert.Equal(t, first, again, "two loads of the same tree must give the same splits")

	// Sorted whole paths: a-b/… before a/… before c/d/…; files 0, 16 and 32 of that order are validation.
	var order []string
	for _, dir := range []string{"a-b", "a", "c/d"} {
		for i := range 40 {
			if []string{"a", "a-b", "c/d"}[i%3] == dir {
				order = append(order, fmt.Sprintf("%s/f%02d.go", dir, i))
			}
		}
	}
	var wantTrain, wantValidation []byte
	for i, rel := range order {
		data, err := os.ReadFile(filepath.Join(root, rel))
		require.NoError(t, err)
		if i%validationEvery == 0 {
			wantValidation = append(wantValidation, data...)
		} else {
			wantTrain = append(wantTrain, data...)
		}
	}
	assert.Equal(t, string(wantTrain), string(first.train))
	assert.Equal(t, string(wantValidation), string(first.validation))
	assert.Equal(t, 3, first.validationFiles)
	assert.Equal(t, 37, first.trainFiles)
	// Every file is in exactly one split: its unique function name appears in one of them only.
	for i := range 40 {
		name := fmt.Sprintf("func F%d()", i)
		inTrain, inValidation := bytes.Contains(first.train, []byte(name)), bytes.Contains(first.validation, []byte(name))
		assert.True(t, inTrain != inValidation, "%s: in training %v, in validation %v", name, inTrain, inValidation)
	}
	assert.NotContains(t, string(first.train)+string(first.validation), "not go")
}

func TestLoadCorpusErrors(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		root       func(t *testing.T) string
	}{
		{"missing", "no such file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nothing") }},
		{"a file", "not a directory", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "x.go")
			require.NoError(t, os.WriteFile(p, []byte("package x\n"), 0o644))
			return p
		}},
		{"one file", "at least 2 are needed", func(t *testing.T) string { return writeCorpus(t, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadCorpus(tc.root(t))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestWindowStarts(t *testing.T) {
	for _, tc := range []struct {
		name                string
		textLen, ctx, count int
		want                []int
		wantErr             bool
	}{
		{name: "all back to back", textLen: 17, ctx: 4, want: []int{0, 4, 8, 12}},
		{name: "last byte only as a label", textLen: 13, ctx: 4, want: []int{0, 4, 8}},
		{name: "spread evenly", textLen: 41, ctx: 4, count: 3, want: []int{0, 12, 24}},
		{name: "more than there are", textLen: 9, ctx: 4, count: 10, want: []int{0, 4}},
		{name: "too short", textLen: 4, ctx: 4, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := windowStarts(tc.textLen, tc.ctx, tc.count)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			for _, s := range got {
				assert.LessOrEqual(t, s+tc.ctx+1, tc.textLen, "every window and its next byte fit the text")
			}
		})
	}
}

func TestWindowSourceShiftsLabelsByOne(t *testing.T) {
	src, err := newWindowSource([]byte("abcdefghij"), 3, 0)
	require.NoError(t, err)
	require.Equal(t, 3, src.Len())
	inputs, labels, err := src.Batch([]int{2, 0})
	require.NoError(t, err)
	assert.Equal(t, [][]int32{{'g', 'h', 'i'}, {'a', 'b', 'c'}}, inputs[0].Value())
	assert.Equal(t, [][][]int32{{{'h'}, {'i'}, {'j'}}, {{'b'}, {'c'}, {'d'}}}, labels[0].Value())
	_, _, err = src.Batch([]int{3})
	assert.Error(t, err)
}

func TestTinyRunLearnsAndPrintsSummary(t *testing.T) {
	root := tinyCorpus(t)
	common := []string{"-data", root, "-context", "16", "-dmodel", "32", "-heads", "2", "-blocks", "1",
		"-batch", "8", "-eval-windows", "24", "-seed", "3", "-lr", "0.01", "-warmup", "2", "-quiet"}
	code, stdout, stderr := runMain(t, append([]string{"-steps", "1", "-warmup", "1"}, common[:len(common)-3]...)...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	untrained := parseSummary(t, stdout)
	code, stdout, stderr = runMain(t, append(common, "-steps", "30", "-k", "2", "-limit", "64")...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	s := parseSummary(t, stdout)

	assert.Equal(t, 1, s.WorldSize)
	assert.Equal(t, "transformer", s.Model)
	assert.EqualValues(t, 30, s.Steps)
	// 64 windows are 8 full batches an epoch, 4 optimizer steps: 30 steps are 60 full micro-batches.
	assert.EqualValues(t, 60, s.MicroBatches, "k=2 micro-batches per step")
	assert.Equal(t, 16, s.GlobalBatch)
	assert.EqualValues(t, 60*8, s.TrainExamples)
	assert.EqualValues(t, 60*8*16, s.TrainTokens)
	assert.Positive(t, s.TokensPerSecond)
	assert.InDelta(t, float64(s.TrainTokens)/s.TrainSeconds, s.TokensPerSecond, 1+1e-3*s.TokensPerSecond)
	// A byte guessed uniformly costs ln 256 ≈ 5.55 nats; the repetitive corpus is far more predictable.
	assert.Greater(t, float64(untrained.ValidationLoss), 4.5)
	assert.Less(t, float64(s.ValidationLoss), float64(untrained.ValidationLoss)-1,
		"30 steps must lower the validation loss well below one step's")
	assert.Equal(t, untrained.Parameters, s.Parameters)
	// 1 block, d 32, context 16: embeddings, the block's two LayerNorms, attention and MLP, the head.
	assert.Equal(t, 256*32+16*32+(2*64+3*(32*32+32)+32*32+32+32*128+128+128*32+32)+64+32*256+256, s.Parameters)
}

func TestRunIsRepeatable(t *testing.T) {
	root := tinyCorpus(t)
	args := []string{"-data", root, "-context", "8", "-dmodel", "16", "-heads", "2", "-blocks", "1", "-batch", "4",
		"-steps", "3", "-warmup", "1", "-eval-windows", "8", "-quiet"}
	_, first, _ := runMain(t, args...)
	code, second, stderr := runMain(t, args...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	assert.Equal(t, parseSummary(t, first).ValidationLoss, parseSummary(t, second).ValidationLoss)
}

func TestBadFlags(t *testing.T) {
	root := tinyCorpus(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-heads", "3"}, "-heads (3) must be positive and divide -dmodel (128)"},
		{[]string{"-steps", "0"}, "-steps must be at least 1"},
		{[]string{"-steps", "5", "-warmup", "6"}, "-warmup must be in [0, -steps]"},
		{[]string{"-lr", "0"}, "-lr must be a positive number"},
		{[]string{"-k", "0"}, "-k must be at least 1"},
		{[]string{"-clip", "-1"}, "-clip must be 0 or a positive number"},
		{[]string{"-eval-windows", "0"}, "-eval-windows must be at least 1"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := runMain(t, append([]string{"-data", root}, tc.args...)...)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr, tc.want)
		})
	}
	t.Run("missing data", func(t *testing.T) {
		code, _, stderr := runMain(t, "-data", filepath.Join(t.TempDir(), "none"), "-steps", "1", "-warmup", "0")
		assert.Equal(t, exitError, code)
		assert.Contains(t, stderr, "reading the corpus")
	})
	t.Run("context longer than the text", func(t *testing.T) {
		code, _, stderr := runMain(t, "-data", writeCorpus(t, 2), "-context", "4096", "-steps", "1", "-warmup", "0")
		assert.Equal(t, exitError, code)
		assert.Contains(t, stderr, "holds no window")
	})
}

func TestDivergedRunFails(t *testing.T) {
	code, stdout, stderr := runMain(t, "-data", tinyCorpus(t), "-context", "8", "-dmodel", "16", "-heads", "2",
		"-blocks", "1", "-batch", "4", "-steps", "20", "-warmup", "0", "-clip", "0", "-lr", "1e30", "-quiet")
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "training diverged at optimizer step")
	assert.NotContains(t, stdout, `{"rank":`, "no summary for a run that did not finish")
}

// TestAttentionIsCausal: changing the byte at position j changes the logits from j on and none before.
func TestAttentionIsCausal(t *testing.T) {
	acc, err := accel.New(accel.WithSeed(9))
	require.NoError(t, err)
	defer func() { require.NoError(t, acc.Close()) }()
	arch := architecture{context: 12, dModel: 16, heads: 2, blocks: 2}
	ctx := context.New()
	ctx.SetParam(context.ParamInitialSeed, int64(9))
	model, err := acc.PrepareModel(ctx, transformer(arch), losses.SparseCategoricalCrossEntropyLogits)
	require.NoError(t, err)
	src, err := newWindowSource([]byte("package main\n\nfunc main() {}\n"), arch.context, 0)
	require.NoError(t, err)
	loader, err := acc.PrepareDataLoader(src, prepareBatch(1))
	require.NoError(t, err)
	batch, err := loader.PeekBatch()
	require.NoError(t, err)
	require.NoError(t, model.Materialize(batch))

	base := []int32{'f', 'u', 'n', 'c', ' ', 'm', 'a', 'i', 'n', '(', ')', ' '}
	logitsOf := func(tokens []int32) [][]float32 {
		out, err := model.Predict(tensors.FromFlatDataAndDimensions(tokens, 1, len(tokens)))
		require.NoError(t, err)
		return out[0].Value().([][][]float32)[0]
	}
	want := logitsOf(base)
	for _, j := range []int{0, 5, 11} {
		changed := append([]int32(nil), base...)
		changed[j] = 'Z'
		got := logitsOf(changed)
		for pos := range base {
			if pos < j {
				assert.Equal(t, want[pos], got[pos], "changing byte %d changed the logits at %d", j, pos)
			} else {
				assert.NotEqual(t, want[pos], got[pos], "changing byte %d left the logits at %d alone", j, pos)
			}
		}
	}
}

func TestWarmupCosine(t *testing.T) {
	lr := warmupCosine(1, 4, 14)
	assert.InDelta(t, 0.25, lr(0), 1e-12)
	assert.InDelta(t, 1, lr(3), 1e-12)
	assert.InDelta(t, 1, lr(4), 1e-12, "the decay starts at the peak")
	assert.InDelta(t, minLRFraction+(1-minLRFraction)/2, lr(9), 1e-12, "half way down the cosine")
	assert.InDelta(t, minLRFraction, lr(14), 1e-12)
	assert.InDelta(t, minLRFraction, lr(100), 1e-12, "it stays at the floor")
	for s := int64(4); s < 14; s++ {
		assert.Greater(t, lr(s), lr(s+1))
	}
}

func prepareBatch(n int) prepare.LoaderOption { return prepare.BatchSize(n) }
