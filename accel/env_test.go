package accel_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/jobenv"
)

// clearConfigEnv unsets every variable OptionsFromEnv reads, for the test's duration.
func clearConfigEnv(t *testing.T) {
	for _, name := range []string{backends.TimeoutEnvVar, backends.CallChecksEnvVar, accel.CheckReplicasEnvVar,
		accel.GradientCompressionEnvVar, "GOMLX_BACKEND", cpu.GradientsEnvVar, cpu.MatmulEnvVar,
		cpu.ThreadsEnvVar, "CUDA_VISIBLE_DEVICES", jobenv.RestartCount} {
		t.Setenv(name, "")
	}
}

// TestResolveFromEnvironment: every configuration variable becomes the option a program passes for the
// same setting, and a program's own option wins over the environment.
func TestResolveFromEnvironment(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		opts  []accel.Option
		check func(t *testing.T, c accel.Configuration)
	}{
		{"defaults", nil, nil, func(t *testing.T, c accel.Configuration) {
			assert.Equal(t, backends.DefaultTimeout, c.CollectiveTimeout)
			assert.False(t, c.Debug)
			assert.False(t, c.ReplicaCheck)
			assert.Equal(t, cpu.Config{}, c.Compute)
			assert.Equal(t, accumulate.NoCompression, c.GradientCompression)
		}},
		{"gradient compression", map[string]string{accel.GradientCompressionEnvVar: "bf16"}, nil,
			func(t *testing.T, c accel.Configuration) {
				assert.Equal(t, accumulate.BF16, c.GradientCompression)
			}},
		{"the option wins over the compression variable", map[string]string{accel.GradientCompressionEnvVar: "bf16"},
			[]accel.Option{accel.WithGradientCompression(accumulate.FP16)}, func(t *testing.T, c accel.Configuration) {
				assert.Equal(t, accumulate.FP16, c.GradientCompression)
			}},
		{"timeout as a duration", map[string]string{backends.TimeoutEnvVar: "45s"}, nil, func(t *testing.T, c accel.Configuration) {
			assert.Equal(t, 45*time.Second, c.CollectiveTimeout)
		}},
		{"timeout in seconds", map[string]string{backends.TimeoutEnvVar: "2.5"}, nil, func(t *testing.T, c accel.Configuration) {
			assert.Equal(t, 2500*time.Millisecond, c.CollectiveTimeout)
		}},
		{"the option wins over the timeout variable", map[string]string{backends.TimeoutEnvVar: "45s"},
			[]accel.Option{accel.WithCollectiveTimeout(time.Second)}, func(t *testing.T, c accel.Configuration) {
				assert.Equal(t, time.Second, c.CollectiveTimeout)
			}},
		{"debug and replica check on", map[string]string{backends.CallChecksEnvVar: "1", accel.CheckReplicasEnvVar: "true"}, nil,
			func(t *testing.T, c accel.Configuration) {
				assert.True(t, c.Debug)
				assert.True(t, c.ReplicaCheck)
			}},
		{"debug and replica check off", map[string]string{backends.CallChecksEnvVar: "0", accel.CheckReplicasEnvVar: "no"}, nil,
			func(t *testing.T, c accel.Configuration) {
				assert.False(t, c.Debug)
				assert.False(t, c.ReplicaCheck)
			}},
		{"switches in the usual spellings: yes, on", map[string]string{backends.CallChecksEnvVar: "yes", accel.CheckReplicasEnvVar: " ON "}, nil,
			func(t *testing.T, c accel.Configuration) {
				assert.True(t, c.Debug)
				assert.True(t, c.ReplicaCheck)
			}},
		{"switches in the usual spellings: TRUE, off", map[string]string{backends.CallChecksEnvVar: "TRUE", accel.CheckReplicasEnvVar: "Off"}, nil,
			func(t *testing.T, c accel.Configuration) {
				assert.True(t, c.Debug)
				assert.False(t, c.ReplicaCheck)
			}},
		{"compute variables", map[string]string{"GOMLX_BACKEND": "go", cpu.GradientsEnvVar: "gomlx",
			cpu.MatmulEnvVar: "go", cpu.ThreadsEnvVar: " 3 ", "CUDA_VISIBLE_DEVICES": "0,1"}, nil,
			func(t *testing.T, c accel.Configuration) {
				assert.Equal(t, cpu.Config{Backend: "go", BackendSource: "GOMLX_BACKEND", Gradients: "gomlx",
					Matmul: "go", Threads: 3, VisibleDevices: "0,1"}, c.Compute)
				_, reason := cpu.Resolve(c.Compute)
				assert.Contains(t, reason, "GOMLX_BACKEND")
			}},
		{"options win over compute variables", map[string]string{"GOMLX_BACKEND": "xla:cpu", cpu.ThreadsEnvVar: "3"},
			[]accel.Option{accel.WithBackend("go"), accel.WithComputeThreads(1), accel.WithMatmul("go")},
			func(t *testing.T, c accel.Configuration) {
				assert.Equal(t, cpu.Config{Backend: "go", Threads: 1, Matmul: "go"}, c.Compute)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearConfigEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			c, err := accel.Resolve(tt.opts...)
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

// TestUnreadableEnvironmentIsAnError: a configuration variable that cannot be read stops New with an
// error naming it, never silently ignored.
func TestUnreadableEnvironmentIsAnError(t *testing.T) {
	tests := []struct{ name, value, wantErr string }{
		{backends.TimeoutEnvVar, "not a duration", `"not a duration" is neither a duration (such as 30s or 10m) nor a number of seconds`},
		{backends.TimeoutEnvVar, "-3s", `"-3s" is not a positive duration`},
		{backends.TimeoutEnvVar, "0", `"0" is not a positive duration`},
		{cpu.ThreadsEnvVar, "none", "want a positive number of threads"},
		{cpu.ThreadsEnvVar, "0", "want a positive number of threads"},
		{backends.CallChecksEnvVar, "enabled", `want 1, true, yes or on (or 0, false, no, off), got "enabled"`},
		{accel.CheckReplicasEnvVar, "2", `want 1, true, yes or on (or 0, false, no, off), got "2"`},
		{accel.GradientCompressionEnvVar, "int8", `accumulate: unknown gradient compression "int8" (want bf16, fp16 or none)`},
		{jobenv.RestartCount, "-1", `want the number of restarts so far (0 or more), got "-1"`},
		{jobenv.RestartCount, "once", `want the number of restarts so far (0 or more), got "once"`},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			clearConfigEnv(t)
			t.Setenv(tt.name, tt.value)
			_, err := accel.Resolve()
			require.ErrorContains(t, err, tt.name+": "+tt.wantErr)
			_, err = accel.New()
			require.ErrorContains(t, err, tt.name+": "+tt.wantErr)
		})
	}
}

// TestEnvironmentReachesTheAccelerator: what the environment configures is what New sets up.
func TestEnvironmentReachesTheAccelerator(t *testing.T) {
	clearConfigEnv(t)
	t.Setenv(backends.TimeoutEnvVar, "90s")
	t.Setenv(backends.CallChecksEnvVar, "true")
	t.Setenv(jobenv.RestartCount, "2")
	acc, err := accel.New()
	require.NoError(t, err)
	defer acc.Close()
	assert.Equal(t, 90*time.Second, acc.Communicator().Timeout())
	assert.True(t, acc.Communicator().CallChecks())
	assert.Equal(t, 2, acc.RestartCount(), "the launcher's restart count")
}

// RestartCount is how many times `accel launch --max-restarts` restarted the job; here the launcher's
// variable is given through OptionsFromEnv's lookup instead of the process's environment.
func ExampleAccelerator_RestartCount() {
	launcher := map[string]string{"GOACCEL_RESTART_COUNT": "1"}
	opts, err := accel.OptionsFromEnv(func(name string) (string, bool) { v, ok := launcher[name]; return v, ok })
	if err != nil {
		fmt.Println(err)
		return
	}
	acc, err := accel.New(append(opts, accel.WithBackend("go"))...)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer acc.Close()
	if acc.RestartCount() > 0 {
		fmt.Printf("restart %d: resuming from the newest checkpoint\n", acc.RestartCount())
	}
	// Output: restart 1: resuming from the newest checkpoint
}

func ExampleOptionsFromEnv() {
	env := map[string]string{"GOACCEL_COLLECTIVE_TIMEOUT": "30s", "GOACCEL_DEBUG": "1"}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	opts, err := accel.OptionsFromEnv(lookup)
	fmt.Println(len(opts), err)
	// Output: 2 <nil>
}

// Resolve shows the configuration New would use: the environment's variables, then the program's options,
// which win.
func ExampleResolve() {
	conf, err := accel.Resolve(accel.WithBackend("go"), accel.WithComputeThreads(2), accel.WithMatmul("go"),
		accel.WithGradientAccumulationSteps(4))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(conf.Compute.Backend, conf.Compute.Threads, conf.Compute.Matmul, conf.AccumulationSteps)
	// Output: go 2 go 4
}

// WithConvolutions chooses how the pure-Go backend convolves: "graph" keeps the slice lowering of earlier
// versions, for comparisons against the default kernels.
func ExampleWithConvolutions() {
	conf, err := accel.Resolve(accel.WithConvolutions("graph"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(conf.Compute.Convolutions)
	// Output: graph
}
