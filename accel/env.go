package accel

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	gomlxbackends "github.com/gomlx/gomlx/backends"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/jobenv"
	"github.com/goaccel/goaccel/prepare"
)

// envSetting is one environment variable goaccel reads and the option it stands for.
type envSetting struct {
	name string
	// option turns the variable's (non-empty) value into the option a program would pass.
	option func(value string) (Option, error)
}

// envSettings are every environment variable that configures goaccel: this is the one place that reads
// them. Each becomes the option a program passes for the same thing, so a program, a test and `accel env`
// resolve one configuration the same way. Launcher variables (ranks, world size) are the topology, read by
// backends.DetectTopology, not configuration.
var envSettings = []envSetting{
	{backends.TimeoutEnvVar, func(v string) (Option, error) {
		d, err := backends.ParseTimeout(v)
		return WithCollectiveTimeout(d), err
	}},
	{backends.CallChecksEnvVar, func(v string) (Option, error) { return onWhenTrue(v, WithDebug) }},
	{CheckReplicasEnvVar, func(v string) (Option, error) { return onWhenTrue(v, WithReplicaCheck) }},
	{GradientCompressionEnvVar, func(v string) (Option, error) {
		format, err := accumulate.ParseCompression(v)
		return WithGradientCompression(format), err
	}},
	{PowerSGDEnvVar, func(v string) (Option, error) {
		cfg, err := parsePowerSGD(v)
		return WithPowerSGD(cfg), err
	}},
	{OverlapEnvVar, func(v string) (Option, error) {
		on, err := parseSwitch(v)
		return WithOverlap(on), err
	}},
	{ShardingEnvVar, func(v string) (Option, error) {
		s, err := accumulate.ParseSharding(v)
		return WithSharding(s), err
	}},
	{LocalSGDEnvVar, func(v string) (Option, error) { return periodOption(v, WithLocalSGD) }},
	{DiLoCoEnvVar, parseDiLoCo},
	{gomlxbackends.ConfigEnvVar, func(v string) (Option, error) {
		return func(c *config) { c.backend, c.backendSource = v, gomlxbackends.ConfigEnvVar }, nil
	}},
	{cpu.GradientsEnvVar, func(v string) (Option, error) { return WithGradientKernels(v), nil }},
	{cpu.MatmulEnvVar, func(v string) (Option, error) { return WithMatmul(v), nil }},
	{cpu.ConvEnvVar, func(v string) (Option, error) { return WithConvolutions(v), nil }},
	{cpu.ThreadsEnvVar, func(v string) (Option, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("want a positive number of threads, got %q", v)
		}
		return WithComputeThreads(n), nil
	}},
	{"CUDA_VISIBLE_DEVICES", func(v string) (Option, error) {
		return func(c *config) { c.visibleDevices = v }, nil
	}},
	{jobenv.Timeline, func(v string) (Option, error) { return WithTimeline(v), nil }},
	{jobenv.RestartCount, func(v string) (Option, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("want the number of restarts so far (0 or more), got %q", v)
		}
		return func(c *config) { c.restartCount = n }, nil
	}},
}

// periodOption reads a local SGD period: a positive h gives on(h), 0 leaves the program's choice alone.
func periodOption(v string, on func(h int) Option) (Option, error) {
	h, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || h < 0 {
		return nil, fmt.Errorf("want the optimizer steps between parameter averages (1 or more; 0 for off), got %q", v)
	}
	if h == 0 {
		return func(*config) {}, nil
	}
	return on(h), nil
}

// parseDiLoCo reads GOACCEL_DILOCO: H, H:LR or H:LR:MOMENTUM (the outer optimizer's learning rate and
// Nesterov momentum, by default prepare.DefaultOuterLearningRate and DefaultOuterMomentum).
func parseDiLoCo(v string) (Option, error) {
	parts := strings.Split(strings.TrimSpace(v), ":")
	if len(parts) > 3 {
		return nil, fmt.Errorf("want H, H:LR or H:LR:MOMENTUM, got %q", v)
	}
	outer := []float64{prepare.DefaultOuterLearningRate, prepare.DefaultOuterMomentum}
	for i, part := range parts[1:] {
		x, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil {
			return nil, fmt.Errorf("want H, H:LR or H:LR:MOMENTUM with numbers, got %q", v)
		}
		outer[i] = x
	}
	return periodOption(parts[0], func(h int) Option { return WithDiLoCo(h, outer[0], outer[1]) })
}

// onWhenTrue is on() for a value that means true, no change for one that means false (off is the default,
// and a program's own option still wins), and an error for anything else: a misspelt switch must not be
// silently off.
func onWhenTrue(v string, on func() Option) (Option, error) {
	set, err := parseSwitch(v)
	if err != nil {
		return nil, err
	}
	if set {
		return on(), nil
	}
	return func(*config) {}, nil
}

// parseSwitch reads a boolean environment variable in the spellings people use: 1, true, yes, on and 0,
// false, no, off, in any case and with surrounding spaces.
func parseSwitch(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("want 1, true, yes or on (or 0, false, no, off), got %q", v)
}

// OptionsFromEnv turns goaccel's environment variables, read through lookup (os.LookupEnv in a program),
// into the options a program would pass for the same settings: GOACCEL_COLLECTIVE_TIMEOUT,
// GOACCEL_DEBUG, GOACCEL_CHECK_REPLICAS, GOACCEL_GRADIENT_COMPRESSION, GOACCEL_SHARDING, GOACCEL_POWERSGD,
// GOACCEL_LOCAL_SGD, GOACCEL_DILOCO, GOACCEL_OVERLAP, GOMLX_BACKEND, GOACCEL_GRADIENTS, GOACCEL_MATMUL, GOACCEL_CONV,
// GOACCEL_BLAS_THREADS, CUDA_VISIBLE_DEVICES, GOACCEL_TIMELINE (WithTimeline) and GOACCEL_RESTART_COUNT (set by
// `accel launch --max-restarts`: Accelerator.RestartCount). New applies them before the program's own options, so an
// option a program passes wins over the environment. A value that cannot be read is an error naming the
// variable, never ignored.
func OptionsFromEnv(lookup func(name string) (string, bool)) ([]Option, error) {
	var opts []Option
	for _, s := range envSettings {
		v, ok := lookup(s.name)
		if !ok || v == "" {
			continue
		}
		opt, err := s.option(v)
		if err != nil {
			return nil, fmt.Errorf("accel: %s: %w", s.name, err)
		}
		opts = append(opts, opt)
	}
	return opts, nil
}

// resolve is the configuration of New: defaults, then the environment's options, then the program's.
func resolve(lookup func(string) (string, bool), opts []Option) (config, error) {
	cfg := defaultConfig()
	envOpts, err := OptionsFromEnv(lookup)
	if err != nil {
		return cfg, err
	}
	for _, opt := range append(envOpts, opts...) {
		opt(&cfg)
	}
	return cfg, cfg.validate()
}

// Configuration is an Accelerator's resolved configuration: the defaults, the environment (see
// OptionsFromEnv) and a program's options, in that order of precedence. It is what New would use, and
// what `accel env` reports.
type Configuration struct {
	// Compute is the compute backend's configuration, before the topology places the process on a device.
	Compute cpu.Config
	// CollectiveTimeout bounds every collective wait.
	CollectiveTimeout time.Duration
	// Debug and ReplicaCheck say whether every collective is verified and whether replicas are compared
	// after every step.
	Debug, ReplicaCheck bool
	// Engine is the collective engine asked for ("" chooses from the topology).
	Engine string
	// AccumulationSteps, SyncEachBatch, BucketCapMB and Seed are the training settings.
	AccumulationSteps int
	SyncEachBatch     bool
	BucketCapMB       float64
	Seed              uint64
	// GradientCompression is the format gradient buckets travel in.
	GradientCompression accumulate.Compression
	// Sharding is the sharding strategy asked for (on one process the job runs replicated).
	Sharding accumulate.Sharding
	// PowerSGD is the PowerSGD configuration asked for (nil: none).
	PowerSGD *accumulate.PowerSGDConfig
	// LocalSGD is local SGD's or DiLoCo's configuration, nil for synchronous training.
	LocalSGD *prepare.LocalSGD
	// Overlap says whether gradient syncs start inside the training step (WithOverlap).
	Overlap bool
}

// Resolve returns the configuration New(opts...) would use in this process's environment, without
// starting anything.
func Resolve(opts ...Option) (Configuration, error) {
	cfg, err := resolve(os.LookupEnv, opts)
	if err != nil {
		return Configuration{}, err
	}
	timeout := cfg.timeout
	if timeout == 0 {
		timeout = backends.DefaultTimeout
	}
	return Configuration{Compute: cfg.computeConfig(backends.Topology{}), CollectiveTimeout: timeout,
		Debug: cfg.debug, ReplicaCheck: cfg.checkReplicas, Engine: cfg.engine,
		AccumulationSteps: cfg.accumulationSteps, SyncEachBatch: cfg.syncEachBatch, BucketCapMB: cfg.bucketCapMB,
		Seed: cfg.seed, GradientCompression: cfg.compression, Sharding: cfg.shardingOrDefault(), PowerSGD: cfg.powerSGD,
		LocalSGD: cfg.localSGD, Overlap: cfg.overlap}, nil
}

// computeConfig is the compute backend's configuration for a process at topo.
func (c config) computeConfig(topo backends.Topology) cpu.Config {
	return cpu.Config{Backend: c.backend, BackendSource: c.backendSource, AllowDownloads: c.allowDownloads,
		LocalRank: topo.LocalRank, LocalSize: topo.LocalSize, Threads: c.computeThreads, Gradients: c.gradients,
		Matmul: c.matmul, Convolutions: c.convolutions, VisibleDevices: c.visibleDevices}
}

// parsePowerSGD reads GOACCEL_POWERSGD: RANK or RANK:START.
func parsePowerSGD(v string) (accumulate.PowerSGDConfig, error) {
	rank, start, hasStart := strings.Cut(strings.TrimSpace(v), ":")
	var cfg accumulate.PowerSGDConfig
	var err error
	if cfg.Rank, err = strconv.Atoi(rank); err != nil || cfg.Rank < 1 {
		return cfg, fmt.Errorf("want RANK or RANK:START with a positive rank, got %q", v)
	}
	cfg.StartIter = 1000
	if hasStart {
		if cfg.StartIter, err = strconv.Atoi(start); err != nil || cfg.StartIter < 0 {
			return cfg, fmt.Errorf("want RANK:START with a start iteration ≥ 0, got %q", v)
		}
	}
	return cfg, nil
}
