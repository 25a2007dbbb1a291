package accel

import (
	"fmt"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/internal/replicas"
)

// settings are what every rank must share for the ranks to train one model together. A rank with another
// K would all-reduce at other times (a hang, or silent garbage), another seed would shuffle differently
// (overlapping shards), another batch size or loader length would run out of batches at another step,
// another optimizer configuration would apply the same gradient differently (diverged replicas), and another
// number of examples would shard another dataset (silently, when the number of batches happens to agree).
func (a *Accelerator) settings() []replicas.Setting {
	s := []replicas.Setting{
		activity("training (the first Backward)"),
		{Name: "gradient accumulation steps (K)", Value: fmt.Sprint(a.state.Steps())},
		{Name: "sync each batch", Value: fmt.Sprint(a.state.SyncEachBatch())},
		{Name: "split batches", Value: fmt.Sprint(a.cfg.splitBatches)},
		{Name: "seed", Value: fmt.Sprint(a.cfg.seed)},
		{Name: "bucket cap (MB)", Value: fmt.Sprint(a.cfg.bucketCapMB)},
		{Name: "gradient communication hook (GOACCEL_GRADIENT_COMPRESSION or accel.WithGradientCompression)",
			Value: a.commHookName()},
		{Name: "sharding strategy (GOACCEL_SHARDING or accel.WithSharding)", Value: a.cfg.shardingOrDefault().Name()},
		{Name: "local SGD (GOACCEL_LOCAL_SGD, GOACCEL_DILOCO, accel.WithLocalSGD or accel.WithDiLoCo)",
			Value: a.rt.LocalSGD.String()},
		{Name: "replica check", Value: fmt.Sprint(a.cfg.checkReplicas)},
		{Name: "timeline (GOACCEL_TIMELINE or accel.WithTimeline)", Value: fmt.Sprint(a.cfg.timeline != "")},
		{Name: "debug mode (collective call checks)", Value: fmt.Sprint(a.comm.CallChecks())},
		{Name: "the number of prepared models", Value: fmt.Sprint(len(a.models))},
		{Name: "the number of prepared optimizers", Value: fmt.Sprint(len(a.optimizers))},
		{Name: "the number of prepared data loaders", Value: fmt.Sprint(len(a.loaders))},
	}
	for i, l := range a.loaders {
		batches := fmt.Sprint(l.Len())
		if a.join != nil && !l.EvenBatches() {
			// Join keeps processes with fewer batches in the others' steps: uneven loaders are what it is for.
			batches = "any (uneven, inside Join)"
		}
		s = append(s,
			replicas.Setting{Name: fmt.Sprintf("data loader %d's batch size per process", i), Value: fmt.Sprint(l.BatchSize())},
			replicas.Setting{Name: fmt.Sprintf("data loader %d's batches per epoch", i), Value: batches},
			replicas.Setting{Name: fmt.Sprintf("data loader %d's number of examples", i), Value: fmt.Sprint(l.SourceLen())},
			replicas.Setting{Name: fmt.Sprintf("data loader %d's place in checkpoints", i), Value: fmt.Sprint(l.Checkpointed())},
			replicas.Setting{Name: fmt.Sprintf("data loader %d dispatched from rank 0 (accel.DispatchBatches)", i),
				Value: fmt.Sprint(l.Dispatched())})
	}
	for i, m := range a.models {
		s = append(s, replicas.Setting{Name: fmt.Sprintf("model %d's buffer sync (accel.WithBufferSync)", i),
			Value: m.BufferSync().String()})
	}
	for i, o := range a.optimizers {
		s = append(s, replicas.Setting{Name: fmt.Sprintf("optimizer %d's configuration", i), Value: o.Describe()})
	}
	return s
}

// CommHookName names the hook that carries the gradient buckets between processes: "identity", "bf16
// compression", "fp16 compression" or PowerSGD's configuration.
func (a *Accelerator) CommHookName() string { return a.commHookName() }

// commHookName names the hook that carries the gradient buckets between ranks: another hook on one rank
// would put buffers of another element type into the same collective (garbage, or MPI_ERR_TRUNCATE).
func (a *Accelerator) commHookName() string {
	if a.rt.CommHook == nil {
		return accumulate.IdentityHook{}.Name()
	}
	return a.rt.CommHook.Name()
}

// agreeOnSettings compares the settings across ranks once, on the first Backward: every rank calls it at
// the same point, and by then the loaders and optimizers of a training loop are prepared. A mismatch is
// the same error on every rank, naming the setting and which ranks have which value.
func (a *Accelerator) agreeOnSettings() error {
	if a.settingsAgreed || a.WorldSize() == 1 {
		return nil
	}
	if err := replicas.CheckSameSettings(a.comm, a.settings()); err != nil {
		return fmt.Errorf("accel: %w", err)
	}
	a.settingsAgreed = true
	return a.alignTimeline()
}

// activity is the first line of every comparison of settings: what the rank is doing. A rank that loads a
// checkpoint while another starts training (-resume given to one rank only) then fails on that line, on
// every rank, instead of a later collective reading the other's unrelated message.
func activity(what string) replicas.Setting {
	return replicas.Setting{Name: "what each rank is doing", Value: what}
}

// agreeOnLoading is LoadState's first collective: every rank must be loading (see activity).
func (a *Accelerator) agreeOnLoading() error {
	if a.WorldSize() == 1 {
		return nil
	}
	if err := replicas.CheckSameSettings(a.comm, []replicas.Setting{activity("loading a checkpoint (LoadState)")}); err != nil {
		return fmt.Errorf("accel: %w", err)
	}
	return nil
}
