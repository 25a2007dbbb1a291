package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// vocabSize is the number of distinct tokens: the model reads and predicts bytes.
const vocabSize = 256

// corpus is the text the model learns from: every .go file under a root, read in sorted order of their
// slash-separated paths relative to the root (the same order on every machine and in the PyTorch twin),
// and split by file: every validationEvery-th file (the first included) is held out for validation, so
// no line of a validation file is ever trained on.
type corpus struct {
	train, validation           []byte
	trainFiles, validationFiles int
}

// validationEvery makes about 6% of the files the validation split.
const validationEvery = 16

// loadCorpus reads the .go files under root and splits them.
func loadCorpus(root string) (*corpus, error) {
	info, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("reading the corpus: %w", err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("reading the corpus: %s is not a directory", root)
	}
	var paths []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".go") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			paths = append(paths, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the corpus: %w", err)
	}
	// WalkDir's order is per directory ("a/b" before "a-b"); a plain sort of whole paths is what any other
	// program reproduces.
	slices.Sort(paths)
	c := &corpus{}
	for i, rel := range paths {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			return nil, fmt.Errorf("reading the corpus: %w", err)
		}
		if i%validationEvery == 0 {
			c.validation = append(c.validation, data...)
			c.validationFiles++
		} else {
			c.train = append(c.train, data...)
			c.trainFiles++
		}
	}
	if c.trainFiles == 0 || c.validationFiles == 0 {
		return nil, fmt.Errorf("reading the corpus: %s holds %d .go files; at least 2 are needed for a training "+
			"and a validation split", root, len(paths))
	}
	return c, nil
}

// windowStarts returns the offsets of count windows of context+1 bytes spread evenly over text: window i
// starts at (i·n/count)·context, where n is the number of back-to-back windows the text holds (every window
// but the last shares its last byte with the next one's first). count 0, or more than n, takes all n.
func windowStarts(textLen, context, count int) ([]int, error) {
	n := (textLen - 1) / context
	if n < 1 {
		return nil, fmt.Errorf("a text of %d bytes holds no window of %d+1 bytes", textLen, context)
	}
	if count <= 0 || count > n {
		count = n
	}
	starts := make([]int, count)
	for i := range starts {
		starts[i] = (i * n / count) * context
	}
	return starts, nil
}

// windowSource serves windows of a text as examples: the input is context bytes, the label the same
// window shifted by one byte, so every position predicts its next byte.
type windowSource struct {
	text    []byte
	starts  []int
	context int
}

func newWindowSource(text []byte, context, count int) (*windowSource, error) {
	starts, err := windowStarts(len(text), context, count)
	if err != nil {
		return nil, err
	}
	return &windowSource{text: text, starts: starts, context: context}, nil
}

func (s *windowSource) Len() int { return len(s.starts) }

// Batch returns int32 inputs [b, context] and labels [b, context, 1] (nextByteLoss, like GoMLX's sparse
// cross-entropy, takes class indices with a last axis of 1).
func (s *windowSource) Batch(indices []int) (inputs, labels []*tensors.Tensor, err error) {
	if len(indices) == 0 {
		return nil, nil, errors.New("an empty batch of windows")
	}
	in := make([]int32, len(indices)*s.context)
	next := make([]int32, len(indices)*s.context)
	for j, idx := range indices {
		if idx < 0 || idx >= len(s.starts) {
			return nil, nil, fmt.Errorf("window %d outside [0, %d)", idx, len(s.starts))
		}
		window := s.text[s.starts[idx] : s.starts[idx]+s.context+1]
		for t := range s.context {
			in[j*s.context+t] = int32(window[t])
			next[j*s.context+t] = int32(window[t+1])
		}
	}
	return []*tensors.Tensor{tensors.FromFlatDataAndDimensions(in, len(indices), s.context)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(next, len(indices), s.context, 1)}, nil
}
