package accel

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/blockstate"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
)

// A model trained under a strategy that splits buckets (ZeRO) holds its optimizer state in blocks, one per
// process. SaveState then writes, besides what every checkpoint holds, one file per process under the
// model's directory, blocks/rank-NNNNN.bin, each written by its own process in parallel: nothing is
// gathered on one rank. state.json records the strategy, the number of processes and the kinds of state
// (savedSharding); the bucket plan, which fixes each block's place, is recorded for every model already.
// LoadState reads any checkpoint into any run: each process of a sharded run reads the ranges of the files
// its own blocks need (so the checkpoint must be on a filesystem every process sees, as the save needs),
// and a replicated run gets the whole state reassembled by the main process, as it would have saved it.

// blocksWritten, set by tests, runs on every rank of a sharded save once its blocks are written, before the
// ranks agree: a rank's error there is a failed write, and a rank that dies there dies mid-save.
var blocksWritten func(rank int) error

// blocksDir is the directory of a model's per-process blocks of optimizer state inside a checkpoint.
const blocksDir = "blocks"

// savedSharding is what state.json records of a model whose optimizer state was saved in blocks.
type savedSharding struct {
	// Strategy is the sharding strategy's name, Processes the number of processes that wrote blocks.
	Strategy  string `json:"strategy"`
	Processes int    `json:"processes"`
	// Slots are the kinds of optimizer state, in the order each file holds them.
	Slots []blockstate.StateSlot `json:"slots"`
}

// layout places model m's blocks on this process.
func (a *Accelerator) layout(m *prepare.Model) blockstate.Layout {
	return blockstate.Layout{Ctx: m.Context(), Plan: m.Plan(), Params: m.Parameters(), Sharding: m.Sharding(),
		Rank: a.Rank(), Size: a.WorldSize()}
}

func blockFile(rank int) string { return filepath.Join(blocksDir, fmt.Sprintf("rank-%05d.bin", rank)) }

// savedShardingOf is what state.json records for model m (nil when its state is replicated).
func (a *Accelerator) savedShardingOf(m *prepare.Model) *savedSharding {
	if m.Sharding() == nil || m.Sharding().Stage() == 0 {
		return nil
	}
	return &savedSharding{Strategy: m.Sharding().Name(), Processes: a.WorldSize(), Slots: a.layout(m).StateSlots()}
}

// blockStates are this rank's blocks of every model's optimizer state (nil for a replicated model), and
// whether any model has some.
func (a *Accelerator) blockStates() ([][]byte, bool, error) {
	blocks := make([][]byte, len(a.models))
	any := false
	for i, m := range a.models {
		if a.savedShardingOf(m) == nil {
			continue
		}
		data, err := a.layout(m).BlockState()
		if err != nil {
			return nil, false, fmt.Errorf("accel: saving state: model %d: %w", i, err)
		}
		blocks[i], any = data, true
	}
	return blocks, any, nil
}

// shareCheckpointDir is every rank's part of a sharded save: the main process sends the temporary
// checkpoint directory ("" when it has none: its save failed before), every rank writes its blocks there
// (the main process also the rest, with alsoWrite, meanwhile), and the ranks agree on the outcome, so that
// the checkpoint is renamed into place only once every rank's file is durable, and every rank returns the
// same error otherwise. Collective.
func (a *Accelerator) shareCheckpointDir(tmp string, state savedState, blocks [][]byte, alsoWrite func() error) error {
	shared, err := broadcastBytes(a.comm, []byte(tmp))
	if err != nil {
		return err
	}
	var writeErr error
	if dir := string(shared); dir != "" {
		if alsoWrite != nil {
			writeErr = alsoWrite()
		}
		writeErr = errors.Join(writeErr, a.writeBlocks(dir, state, blocks))
		if blocksWritten != nil {
			writeErr = errors.Join(writeErr, blocksWritten(a.Rank()))
		}
	}
	return replicas.Agree(a.comm, "accel: saving state: writing the processes' blocks of optimizer state", writeErr)
}

// writeBlocks writes this rank's blocks of each model into the checkpoint being written at dir.
func (a *Accelerator) writeBlocks(dir string, state savedState, blocks [][]byte) error {
	if _, err := os.Stat(dir); err != nil {
		host, _ := os.Hostname()
		return fmt.Errorf("rank %d on %s cannot see the checkpoint being written (%w): a sharded checkpoint is "+
			"written by every process, so its directory must be on a filesystem every process sees", a.Rank(),
			host, err)
	}
	for i, data := range blocks {
		if data == nil {
			continue
		}
		modelDir := filepath.Join(dir, state.Models[i].Dir)
		if err := os.MkdirAll(filepath.Join(modelDir, blocksDir), 0o755); err != nil {
			return err
		}
		if err := checkpoint.WriteFile(filepath.Join(modelDir, blockFile(a.Rank())), data); err != nil {
			return err
		}
	}
	return nil
}

// blockFiles reads ranges of a sharded checkpoint's blocks: the flat layout of each slot of state, bucket
// by bucket, as Processes ranks split it.
type blockFiles struct {
	modelDir string
	saved    savedSharding
	layout   blockstate.Layout
	files    map[int]*os.File
}

func newBlockFiles(modelDir string, saved savedSharding, layout blockstate.Layout) *blockFiles {
	return &blockFiles{modelDir: modelDir, saved: saved, layout: layout, files: map[int]*os.File{}}
}

func (f *blockFiles) Close() error {
	var err error
	for _, file := range f.files {
		err = errors.Join(err, file.Close())
	}
	return err
}

// file opens saved rank r's file and checks its length.
func (f *blockFiles) file(r int) (*os.File, error) {
	if file, ok := f.files[r]; ok {
		return file, nil
	}
	file, err := os.Open(filepath.Join(f.modelDir, blockFile(r)))
	if err != nil {
		return nil, err
	}
	info, err := file.Stat()
	if err == nil {
		if want := f.layout.BlockStateLen(f.saved.Slots, r, f.saved.Processes); info.Size() != int64(want) {
			err = fmt.Errorf("%s has %d bytes; rank %d of %d holds %d", blockFile(r), info.Size(), r,
				f.saved.Processes, want)
		}
	}
	if err != nil {
		_ = file.Close()
		return nil, err
	}
	f.files[r] = file
	return file, nil
}

// read is a blockstate.SlotReader over the files.
func (f *blockFiles) read(slot blockstate.StateSlot, b, from, to int, dst []byte) error {
	k := slices.Index(f.saved.Slots, slot)
	if k < 0 {
		return fmt.Errorf("the checkpoint holds no optimizer state %s…%s (%s): it was saved with another "+
			"optimizer", slot.Prefix, slot.Suffix, slot.DType)
	}
	plan := f.layout.Plan
	if b >= len(plan.Buckets) {
		return fmt.Errorf("bucket %d of a plan of %d", b, len(plan.Buckets))
	}
	blocks := accumulate.ShardOptimizer{}
	elem := slot.DType.Size()
	for r := range f.saved.Processes {
		rFrom, rTo := blocks.Owned(plan.Buckets[b].Size, r, f.saved.Processes)
		lo, hi := max(from, rFrom), min(to, rTo)
		if lo >= hi {
			continue
		}
		// Rank r's file holds, slot after slot and bucket after bucket, its real elements of each block.
		offset := 0
	layout:
		for kk, s := range f.saved.Slots {
			for bb, bucket := range plan.Buckets {
				if kk == k && bb == b {
					break layout
				}
				oFrom, oTo := blocks.Owned(bucket.Size, r, f.saved.Processes)
				offset += (oTo - oFrom) * s.DType.Size()
			}
		}
		file, err := f.file(r)
		if err != nil {
			return err
		}
		if _, err := file.ReadAt(dst[(lo-from)*elem:(hi-from)*elem], int64(offset+(lo-rFrom)*elem)); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: %w", blockFile(r), err)
		}
	}
	return nil
}

// checkSavedSharding refuses a manifest SaveState never writes.
func checkSavedSharding(s *savedSharding) error {
	if s == nil {
		return nil
	}
	if _, err := accumulate.ParseSharding(s.Strategy); err != nil || s.Strategy == "replicated" {
		return fmt.Errorf("blocks saved by strategy %q", s.Strategy)
	}
	if s.Processes < 2 || s.Processes > 1<<20 {
		return fmt.Errorf("blocks saved by %d processes", s.Processes)
	}
	for _, slot := range s.Slots {
		if slot.DType.Size() <= 0 {
			return fmt.Errorf("optimizer state %s…%s has dtype %s", slot.Prefix, slot.Suffix, slot.DType)
		}
	}
	return nil
}

// replicatedSlotVariables reassembles a sharded checkpoint's optimizer state of model m as a replicated
// run keeps it, for the main process to send with the other variables (a replicated run loading a
// sharded checkpoint).
func replicatedSlotVariables(modelDir string, saved savedSharding, m blockstate.Layout) (vars []savedVariable, err error) {
	files := newBlockFiles(modelDir, saved, m)
	defer func() { err = errors.Join(err, files.Close()) }()
	for _, slot := range saved.Slots {
		values, err := m.SlotToParameters(slot, files.read)
		if err != nil {
			return nil, err
		}
		for name, t := range values {
			sv := savedVariable{Name: name, DType: t.DType(), Dims: slices.Clone(t.Shape().Dimensions)}
			if err := t.ConstBytes(func(data []byte) { sv.Data = slices.Clone(data) }); err != nil {
				return nil, err
			}
			vars = append(vars, sv)
		}
	}
	slices.SortFunc(vars, func(a, b savedVariable) int { return strings.Compare(a.Name, b.Name) })
	return vars, nil
}

// blockValues are the values of a sharded run's blocks of optimizer state from a checkpoint: read from the
// blocks files of a sharded checkpoint, or cut from the replicated variables of another (which it takes
// out of saved, so that the rest matches the run's replicated variables).
func blockValues(m blockstate.Layout, checkpointPath string, sm savedModel, saved []savedVariable) (
	map[*context.Variable]*tensors.Tensor, []savedVariable, error) {
	if sm.Sharding != nil {
		files := newBlockFiles(filepath.Join(checkpointPath, sm.Dir), *sm.Sharding, m)
		values, err := m.ReadBlockState(files.read)
		return values, saved, errors.Join(err, files.Close())
	}
	slotNames := map[string]bool{}
	for _, slot := range m.StateSlots() {
		for p := range m.Params {
			slotNames[m.SlotParameterName(slot, p)] = true
		}
	}
	byName := map[string][]byte{}
	var rest []savedVariable
	for _, sv := range saved {
		if slotNames[sv.Name] {
			byName[sv.Name] = sv.Data
		} else {
			rest = append(rest, sv)
		}
	}
	values, err := m.ReadBlockState(m.ReadSlotFromParameters(byName))
	return values, rest, err
}
