package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	mlcontext "github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestRestartAfterAKilledRank: the demo under `accel launch -n 2 --max-restarts 2`, saving every 32
// optimizer steps and resuming when it can (-resume), has one of its two ranks killed with a real SIGKILL
// in the middle of its second epoch, after checkpoints were saved. The launcher names the rank and
// restarts the job, which resumes from the newest checkpoint and finishes with exit 0; its final weights
// (every variable of the last checkpoint: parameters, Adam's moments, counters, random state) are bitwise
// those of an uninterrupted run with the same checkpoints, and its log is the same, record for record.
func TestRestartAfterAKilledRank(t *testing.T) {
	mpitest.RequireMPIRun(t)
	accelBin, demoBin := buildLauncherAndDemo(t)
	data := writeFakeDataset(t, 2048, 64)
	// 1024 examples per rank in batches of 4, K=2: 128 optimizer steps per epoch.
	const stepsPerEpoch, every = 128, 32
	demoFlags := []string{"-data", data, "-epochs", "3", "-batch", "4", "-k", "2", "-hidden", "16", "-quiet",
		"-seed", "3", "-checkpoint-every", strconv.Itoa(every), "-resume"}
	out := t.TempDir()
	job := func(name string, restarts int) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		args := []string{"launch", "-n", "2", "--max-restarts", strconv.Itoa(restarts), "--", demoBin}
		args = append(append(args, demoFlags...), "-checkpoints", filepath.Join(out, name),
			"-log", filepath.Join(out, name+".jsonl"))
		cmd := exec.CommandContext(ctx, accelBin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd, &stdout, &stderr, cancel
	}

	straight, stdout, stderr, cancel := job("straight", 0)
	defer cancel()
	require.NoError(t, straight.Run(), "stdout: %s\nstderr: %s", stdout, stderr)
	assert.Contains(t, stdout.String(), "no checkpoint in "+filepath.Join(out, "straight")+" yet: starting from the beginning")

	restarted, stdout, stderr, cancel := job("restarted", 2)
	defer cancel()
	require.NoError(t, restarted.Start())
	waited := make(chan error, 1)
	go func() { waited <- restarted.Wait() }()
	logFile, ckptDir := filepath.Join(out, "restarted.jsonl"), filepath.Join(out, "restarted")

	// Wait until the job is well into its second epoch, past a checkpoint inside it.
	deadline := time.Now().Add(5 * time.Minute)
	for lossRecords(t, logFile) < stepsPerEpoch+every+8 {
		select {
		case err := <-waited:
			t.Fatalf("the job ended (%v) before the kill:\nstdout: %s\nstderr: %s", err, stdout, stderr)
		case <-time.After(5 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "the job did not reach its second epoch")
	}
	rank1 := rankProcess(t, restarted.Process.Pid, demoBin, 1)
	// Stopped, rank 1 holds the job at the next gradient sync: rank 0 cannot get further than the step
	// it is in, so the kill lands where the log says.
	require.NoError(t, syscall.Kill(rank1, syscall.SIGSTOP))
	steps := lossRecords(t, logFile)
	for {
		time.Sleep(200 * time.Millisecond)
		now := lossRecords(t, logFile)
		if now == steps {
			break
		}
		steps = now
	}
	saved := newestCheckpointSteps(t, ckptDir)
	require.NotZero(t, steps%stepsPerEpoch, "the kill is inside an epoch (step %d)", steps)
	require.Less(t, saved, int64(steps), "a checkpoint was saved before the kill, and training went on after it")
	require.GreaterOrEqual(t, saved, int64(stepsPerEpoch+every), "the newest checkpoint is inside the second epoch")
	require.NoError(t, syscall.Kill(rank1, syscall.SIGKILL))
	t.Logf("killed rank 1 (pid %d) at optimizer step %d; the newest checkpoint was at step %d", rank1, steps, saved)

	err := <-waited
	require.NoError(t, err, "the restarted job must finish with exit 0:\nstdout: %s\nstderr: %s", stdout, stderr)
	// Open MPI names the rank in most runs, and in the others only says that a process failed.
	assert.Regexp(t, `accel launch: (rank 1|a process) was killed by signal 9 \(killed\); restarting the job \(restart 1 of 2\)`, stderr.String())
	assert.NotContains(t, stderr.String(), "restart 2 of 2")
	assert.Contains(t, stdout.String(), fmt.Sprintf("resumed from %s (restart 1 after a failure): epoch 2, %d optimizer steps done",
		ckptDir, saved))
	final := parseSummary(t, stdout.String())
	assert.Equal(t, 1, final.RestartCount)
	assert.Equal(t, int64(3*stepsPerEpoch), final.OptimizerSteps)

	want := checkpointVariables(t, filepath.Join(out, "straight"))
	got := checkpointVariables(t, ckptDir)
	require.NotEmpty(t, want)
	assert.Equal(t, sortedKeys(want), sortedKeys(got))
	for name, value := range want {
		assert.True(t, bytes.Equal(value, got[name]), "variable %s differs from the uninterrupted run's", name)
	}
	wantLog, err := os.ReadFile(filepath.Join(out, "straight.jsonl"))
	require.NoError(t, err)
	gotLog, err := os.ReadFile(logFile)
	require.NoError(t, err)
	assert.Equal(t, string(wantLog), string(gotLog), "the log, record for record")
}

// lossRecords counts the loss records of a JSON Lines log: the optimizer steps the main process logged.
func lossRecords(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	return strings.Count(string(data), `"loss":`)
}

// rankProcess finds the process of the given rank that the launcher with pid launcher started from
// program: the one below it in the process tree whose executable is program and whose environment has
// Open MPI's OMPI_COMM_WORLD_RANK=rank.
func rankProcess(t *testing.T, launcher int, program string, rank int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != program {
			continue
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !slices.Contains(strings.Split(string(environ), "\x00"), fmt.Sprintf("OMPI_COMM_WORLD_RANK=%d", rank)) {
			continue
		}
		if descendsFrom(pid, launcher) {
			return pid
		}
	}
	t.Fatalf("no process of rank %d of %s below pid %d", rank, program, launcher)
	return 0
}

// descendsFrom reports whether ancestor is pid's parent, grandparent, …
func descendsFrom(pid, ancestor int) bool {
	for pid > 1 {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// The parent follows the state, after the command name (in parentheses, which may hold spaces).
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 {
			return false
		}
		if pid, err = strconv.Atoi(fields[1]); err != nil {
			return false
		}
		if pid == ancestor {
			return true
		}
	}
	return false
}

// newestCheckpointSteps reads the optimizer steps recorded by the newest complete checkpoint under dir.
func newestCheckpointSteps(t *testing.T, dir string) int64 {
	t.Helper()
	latest, err := checkpoint.Latest(dir)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(latest, "state.json"))
	require.NoError(t, err)
	var state struct {
		Optimizers []struct {
			Steps int64 `json:"steps"`
		} `json:"optimizers"`
	}
	require.NoError(t, json.Unmarshal(data, &state))
	require.Len(t, state.Optimizers, 1)
	return state.Optimizers[0].Steps
}

// checkpointVariables reads every variable of the newest checkpoint under dir, as GoMLX saved them, by
// name: the bytes to compare runs with.
func checkpointVariables(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	latest, err := checkpoint.Latest(dir)
	require.NoError(t, err)
	_, err = checkpoint.Verify(latest)
	require.NoError(t, err)
	h, err := checkpoints.Load(mlcontext.New()).Dir(filepath.Join(latest, "model-0")).ExcludeAllParams().Done()
	require.NoError(t, err)
	vars := map[string][]byte{}
	for name, value := range h.LoadedVariables() {
		require.NoError(t, value.ConstBytes(func(b []byte) { vars[name] = slices.Clone(b) }))
	}
	return vars
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
