package checkpoint_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/checkpoint"
)

func writeText(text string) checkpoint.Writer {
	return func(dir string) error {
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
			return err
		}
		return checkpoint.WriteFile(filepath.Join(dir, "sub", "data.txt"), []byte(text))
	}
}

// rewriteManifest changes the manifest of the checkpoint dir with edit.
func rewriteManifest(dir string, edit func(*checkpoint.Manifest)) error {
	path := filepath.Join(dir, checkpoint.ManifestFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var m checkpoint.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	edit(&m)
	if data, err = json.Marshal(m); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func TestWriteKeepsNewestAndVerifies(t *testing.T) {
	root := t.TempDir()
	for i := range 5 {
		path, err := checkpoint.Write(root, 3, writeText(fmt.Sprint("v", i)))
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(root, fmt.Sprintf("checkpoint-%08d", i+1)), path)
	}
	all, err := checkpoint.List(root)
	require.NoError(t, err)
	require.Len(t, all, 3, "only the newest 3 are kept")
	assert.Equal(t, "checkpoint-00000003", filepath.Base(all[0]))

	latest, err := checkpoint.Latest(root)
	require.NoError(t, err)
	m, err := checkpoint.Verify(latest)
	require.NoError(t, err)
	assert.Equal(t, 5, m.Sequence)
	assert.Contains(t, m.Files, "sub/data.txt")
	data, err := os.ReadFile(filepath.Join(latest, "sub", "data.txt"))
	require.NoError(t, err)
	assert.Equal(t, "v4", string(data))

	self, err := checkpoint.Latest(latest)
	require.NoError(t, err)
	assert.Equal(t, latest, self, "a checkpoint directory is its own latest")
}

func TestFailedOrInterruptedWritesLeaveNoCheckpoint(t *testing.T) {
	root := t.TempDir()
	_, err := checkpoint.Write(root, 0, writeText("good"))
	require.NoError(t, err)

	_, err = checkpoint.Write(root, 0, func(dir string) error {
		_ = checkpoint.WriteFile(filepath.Join(dir, "half"), []byte("x"))
		return errors.New("disk full")
	})
	require.ErrorContains(t, err, "disk full")
	// A writer killed mid-way leaves a temporary directory behind: it is not a checkpoint.
	require.NoError(t, os.Mkdir(filepath.Join(root, ".tmp-checkpoint-00000002-123"), 0o755))
	all, err := checkpoint.List(root)
	require.NoError(t, err)
	assert.Len(t, all, 1)
	latest, err := checkpoint.Latest(root)
	require.NoError(t, err)
	assert.Equal(t, "checkpoint-00000001", filepath.Base(latest))

	// The next write removes the leftover.
	_, err = checkpoint.Write(root, 0, writeText("next"))
	require.NoError(t, err)
	leftovers, _ := filepath.Glob(filepath.Join(root, ".tmp-*"))
	assert.Empty(t, leftovers)
}

func TestVerifyRefusesDamage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
		want   string
	}{
		{"changed file", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "sub", "data.txt"), []byte("tampered"), 0o644)
		}, "damaged"},
		{"missing file", func(dir string) error { return os.Remove(filepath.Join(dir, "sub", "data.txt")) }, "no such file"},
		{"no manifest", func(dir string) error { return os.Remove(filepath.Join(dir, checkpoint.ManifestFile)) }, "incomplete"},
		{"corrupt manifest", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, checkpoint.ManifestFile), []byte("{"), 0o644)
		}, "corrupt"},
		{"manifest naming a file outside the checkpoint", func(dir string) error {
			// The file is there and its checksum right: Verify must still not read it.
			outside := []byte("not the checkpoint's")
			if err := os.WriteFile(filepath.Join(dir, "..", "outside.txt"), outside, 0o644); err != nil {
				return err
			}
			sum := sha256.Sum256(outside)
			return rewriteManifest(dir, func(m *checkpoint.Manifest) { m.Files["../outside.txt"] = hex.EncodeToString(sum[:]) })
		}, `corrupt MANIFEST.json: file "../outside.txt": not a path inside the checkpoint`},
		{"manifest with a malformed checksum", func(dir string) error {
			return rewriteManifest(dir, func(m *checkpoint.Manifest) { m.Files["sub/data.txt"] = "00" })
		}, `corrupt MANIFEST.json: file sub/data.txt: checksum "00" is not a SHA-256 in lowercase hex`},
		{"manifest without a sequence", func(dir string) error {
			return rewriteManifest(dir, func(m *checkpoint.Manifest) { m.Sequence = 0 })
		}, "corrupt MANIFEST.json: sequence 0: must be at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, err := checkpoint.Write(t.TempDir(), 0, writeText("v"))
			require.NoError(t, err)
			require.NoError(t, tc.damage(path))
			_, err = checkpoint.Verify(path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestLatestWithoutCheckpoints: a directory with no checkpoint at all is ErrNoCheckpoint (a job that resumes
// when it can starts afresh); one whose checkpoints are all incomplete is not.
func TestLatestWithoutCheckpoints(t *testing.T) {
	for _, root := range []string{filepath.Join(t.TempDir(), "missing"), t.TempDir()} {
		_, err := checkpoint.Latest(root)
		assert.ErrorContains(t, err, "no checkpoint in "+root)
		assert.ErrorIs(t, err, checkpoint.ErrNoCheckpoint)
		_, _, err = checkpoint.LatestIntact(root)
		assert.ErrorIs(t, err, checkpoint.ErrNoCheckpoint)
	}
	root := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(root, "checkpoint-00000001"), 0o755))
	_, err := checkpoint.Latest(root)
	assert.ErrorContains(t, err, "no complete checkpoint")
	assert.NotErrorIs(t, err, checkpoint.ErrNoCheckpoint)
	_, _, err = checkpoint.LatestIntact(root)
	assert.ErrorContains(t, err, "no intact checkpoint")
	assert.NotErrorIs(t, err, checkpoint.ErrNoCheckpoint)
}

// TestIncompleteCheckpointsAreMovedAside: once a newer complete checkpoint is written, older directories
// without a manifest are moved aside to .incomplete-checkpoint-N with their files, and neither List nor
// the next sequence number counts them.
func TestIncompleteCheckpointsAreMovedAside(t *testing.T) {
	root := t.TempDir()
	for i := range 3 {
		_, err := checkpoint.Write(root, 0, writeText(fmt.Sprint("v", i)))
		require.NoError(t, err)
	}
	for _, seq := range []int{1, 3} {
		require.NoError(t, os.Remove(filepath.Join(root, fmt.Sprintf("checkpoint-%08d", seq), checkpoint.ManifestFile)))
	}
	// A name taken already gets a suffix.
	require.NoError(t, os.Mkdir(filepath.Join(root, ".incomplete-checkpoint-00000001"), 0o755))
	all, err := checkpoint.List(root)
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(root, "checkpoint-00000002")}, all, "List counts complete checkpoints only")

	path, err := checkpoint.Write(root, 0, writeText("v3"))
	require.NoError(t, err)
	assert.Equal(t, "checkpoint-00000004", filepath.Base(path))
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"checkpoint-00000002", "checkpoint-00000004", ".incomplete-checkpoint-00000001",
		".incomplete-checkpoint-00000001.2", ".incomplete-checkpoint-00000003"}, names)
	data, err := os.ReadFile(filepath.Join(root, ".incomplete-checkpoint-00000003", "sub", "data.txt"))
	require.NoError(t, err)
	assert.Equal(t, "v2", string(data), "the files stay, for inspection")
	path, err = checkpoint.Write(root, 0, writeText("v4"))
	require.NoError(t, err)
	assert.Equal(t, "checkpoint-00000005", filepath.Base(path))
}

// TestIncompleteCheckpointsDoNotCountAgainstTheLimit: with a limit of 2, an incomplete directory does not
// push a complete checkpoint out.
func TestIncompleteCheckpointsDoNotCountAgainstTheLimit(t *testing.T) {
	root := t.TempDir()
	for i := range 2 {
		_, err := checkpoint.Write(root, 2, writeText(fmt.Sprint("v", i)))
		require.NoError(t, err)
	}
	require.NoError(t, os.Remove(filepath.Join(root, "checkpoint-00000002", checkpoint.ManifestFile)))
	_, err := checkpoint.Write(root, 2, writeText("v2"))
	require.NoError(t, err)
	all, err := checkpoint.List(root)
	require.NoError(t, err)
	require.Len(t, all, 2)
	assert.Equal(t, "checkpoint-00000001", filepath.Base(all[0]), "the older complete checkpoint is kept")
	assert.Equal(t, "checkpoint-00000003", filepath.Base(all[1]))
}

func Example() {
	root, _ := os.MkdirTemp("", "ckpt")
	defer os.RemoveAll(root)
	for _, text := range []string{"first", "second", "third"} {
		_, err := checkpoint.Write(root, 2, func(dir string) error {
			return checkpoint.WriteFile(filepath.Join(dir, "weights.txt"), []byte(text))
		})
		if err != nil {
			fmt.Println(err)
		}
	}
	all, _ := checkpoint.List(root)
	latest, _ := checkpoint.Latest(root)
	_, err := checkpoint.Verify(latest)
	data, _ := os.ReadFile(filepath.Join(latest, "weights.txt"))
	fmt.Println(len(all), filepath.Base(latest), string(data), err)
	// Output: 2 checkpoint-00000003 third <nil>
}

// TestLatestIntactFallsBack: when the newest checkpoints are incomplete or damaged, LatestIntact returns
// the newest intact one and says why each newer one was passed over; a checkpoint named directly is never
// replaced by another.
func TestLatestIntactFallsBack(t *testing.T) {
	damage := map[string]func(t *testing.T, dir string){
		"incomplete": func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, checkpoint.ManifestFile)))
		},
		"damaged": func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "sub", "data.txt"), []byte("other"), 0o644))
		},
	}
	for _, tc := range []struct {
		name    string
		damaged []string // applied to the newest checkpoints, newest first
		want    string   // the checkpoint returned, or "" for an error
		reasons []string
	}{
		{"newest intact", nil, "checkpoint-00000003", nil},
		{"newest incomplete", []string{"incomplete"}, "checkpoint-00000002", []string{"incomplete"}},
		{"two damaged", []string{"damaged", "incomplete"}, "checkpoint-00000001", []string{"checksum mismatch", "incomplete"}},
		{"none intact", []string{"damaged", "damaged", "incomplete"}, "", []string{"checksum mismatch", "checksum mismatch", "incomplete"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for i := range 3 {
				_, err := checkpoint.Write(root, 0, writeText(fmt.Sprint("v", i)))
				require.NoError(t, err)
			}
			all, err := checkpoint.List(root)
			require.NoError(t, err)
			for i, how := range tc.damaged {
				damage[how](t, all[len(all)-1-i])
			}
			path, skipped, err := checkpoint.LatestIntact(root)
			require.Len(t, skipped, len(tc.reasons))
			for i, reason := range tc.reasons {
				assert.ErrorContains(t, skipped[i], reason)
			}
			if tc.want == "" {
				require.ErrorContains(t, err, "no intact checkpoint")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, filepath.Base(path))
		})
	}
	t.Run("named checkpoint", func(t *testing.T) {
		root := t.TempDir()
		for i := range 2 {
			_, err := checkpoint.Write(root, 0, writeText(fmt.Sprint("v", i)))
			require.NoError(t, err)
		}
		all, err := checkpoint.List(root)
		require.NoError(t, err)
		damage["damaged"](t, all[1])
		_, _, err = checkpoint.LatestIntact(all[1])
		require.ErrorContains(t, err, "checksum mismatch")
	})
}

// ErrNoCheckpoint tells a directory with no checkpoint yet — where a job that resumes when it can starts
// afresh — from one whose checkpoints are unusable.
func ExampleErrNoCheckpoint() {
	root, _ := os.MkdirTemp("", "ckpt")
	defer os.RemoveAll(root)
	_, err := checkpoint.Latest(root)
	fmt.Println(errors.Is(err, checkpoint.ErrNoCheckpoint))
	_, _ = checkpoint.Write(root, 0, func(dir string) error {
		return checkpoint.WriteFile(filepath.Join(dir, "weights.txt"), []byte("w"))
	})
	_, err = checkpoint.Latest(root)
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}
