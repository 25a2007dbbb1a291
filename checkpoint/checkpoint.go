// Package checkpoint writes checkpoint directories atomically and finds the latest complete one.
//
// A checkpoint is written into a temporary directory next to its final place, every file and the directory
// itself are fsynced, and only then is it renamed to checkpoint-NNNNNNNN: a process killed at any moment
// leaves either the new checkpoint whole or no trace of it beside the previous ones. A manifest records the
// SHA-256 of every file, so a checkpoint damaged later (a disk error, a partial copy) is refused on load
// rather than silently training from garbage.
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

const (
	// Prefix names complete checkpoints: Prefix + an 8-digit sequence number.
	Prefix = "checkpoint-"
	// tempPrefix names checkpoints being written; they are ignored by Latest and removed by the next Write.
	tempPrefix = ".tmp-"
	// asidePrefix names incomplete checkpoints Write moved out of the way; nothing lists or counts them.
	asidePrefix = ".incomplete-"
	// ManifestFile lists the checkpoint's files and their checksums; it is written last.
	ManifestFile = "MANIFEST.json"
)

// ErrNoCheckpoint is returned (wrapped) by Latest and LatestIntact when a directory holds no checkpoint at
// all, complete or not: a job resuming "when it can" starts afresh on it, and on nothing else.
var ErrNoCheckpoint = errors.New("checkpoint: no checkpoint")

// Manifest describes a checkpoint's files.
type Manifest struct {
	Sequence int               `json:"sequence"`
	Files    map[string]string `json:"files"` // relative path → hex SHA-256
}

// Writer fills a temporary checkpoint directory. It must only create files under dir.
type Writer func(dir string) error

// Write creates the next checkpoint under root: fill runs on a fresh temporary directory, then the
// checkpoint is made durable and renamed into place. It returns the new checkpoint's path.
//
// Once the new checkpoint is in place, older checkpoint directories without a manifest (a copy cut short,
// a manifest deleted by hand: never something Write leaves) are moved aside to .incomplete-checkpoint-N,
// where nothing lists or counts them and their files stay for inspection. Then the newest keep complete
// checkpoints are kept (all if keep <= 0) and older complete ones removed: an incomplete directory never
// counts against keep.
func Write(root string, keep int, fill Writer) (string, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", unusableRoot(root, err)
	}
	removeStaleTemps(root)
	existing, err := listNamed(root)
	if err != nil {
		return "", err
	}
	seq := 1
	if len(existing) > 0 {
		seq = sequenceOf(existing[len(existing)-1]) + 1
	}
	final := filepath.Join(root, fmt.Sprintf("%s%08d", Prefix, seq))
	tmp, err := os.MkdirTemp(root, fmt.Sprintf("%s%s%08d-", tempPrefix, Prefix, seq))
	if err != nil {
		return "", fmt.Errorf("checkpoint: creating a temporary directory in %s: %w", root, err)
	}
	cleanup := func() { _ = os.RemoveAll(tmp) }
	if err := fill(tmp); err != nil {
		cleanup()
		return "", err
	}
	manifest := Manifest{Sequence: seq, Files: map[string]string{}}
	err = filepath.WalkDir(tmp, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			if err == nil && path != tmp {
				return syncPath(path)
			}
			return err
		}
		sum, err := syncAndHash(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tmp, path)
		manifest.Files[filepath.ToSlash(rel)] = sum
		return nil
	})
	if err == nil {
		err = writeFileSync(filepath.Join(tmp, ManifestFile), manifest)
	}
	if err == nil {
		err = syncPath(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err == nil {
		// The rename is durable only once the parent directory is.
		err = syncPath(root)
	}
	if err != nil {
		cleanup()
		return "", fmt.Errorf("checkpoint: writing %s: %w", final, err)
	}
	if err := moveAsideIncomplete(existing); err != nil {
		return final, err
	}
	if keep > 0 {
		all, err := List(root)
		if err != nil {
			return final, err
		}
		for _, old := range all[:max(0, len(all)-keep)] {
			if err := os.RemoveAll(old); err != nil {
				return final, fmt.Errorf("checkpoint: removing old checkpoint %s: %w", old, err)
			}
		}
	}
	return final, nil
}

// List returns root's complete checkpoints (those with a manifest), oldest first.
func List(root string) ([]string, error) {
	named, err := listNamed(root)
	if err != nil {
		return nil, err
	}
	var complete []string
	for _, dir := range named {
		if hasManifest(dir) {
			complete = append(complete, dir)
		}
	}
	return complete, nil
}

func hasManifest(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, ManifestFile))
	return err == nil
}

// moveAsideIncomplete renames each of dirs that has no manifest to .incomplete-NAME beside it (with a
// numeric suffix if that name is taken).
func moveAsideIncomplete(dirs []string) error {
	for _, dir := range dirs {
		if hasManifest(dir) {
			continue
		}
		aside := filepath.Join(filepath.Dir(dir), asidePrefix+filepath.Base(dir))
		for i := 2; ; i++ {
			if _, err := os.Lstat(aside); errors.Is(err, fs.ErrNotExist) {
				break
			}
			aside = filepath.Join(filepath.Dir(dir), fmt.Sprintf("%s%s.%d", asidePrefix, filepath.Base(dir), i))
		}
		if err := os.Rename(dir, aside); err != nil {
			return fmt.Errorf("checkpoint: moving incomplete checkpoint %s aside: %w", dir, err)
		}
	}
	return nil
}

// listNamed returns root's directories named like checkpoints, complete or not, oldest first.
func listNamed(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("checkpoint: listing %s: %w", root, err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && sequenceOf(e.Name()) > 0 {
			dirs = append(dirs, filepath.Join(root, e.Name()))
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return sequenceOf(dirs[i]) < sequenceOf(dirs[j]) })
	return dirs, nil
}

// Latest returns the newest complete checkpoint: root itself if it is one, else the newest under it.
func Latest(root string) (string, error) {
	if hasManifest(root) {
		return root, nil
	}
	all, err := List(root)
	if err != nil {
		return "", err
	}
	if len(all) == 0 {
		if named, _ := listNamed(root); len(named) > 0 {
			return "", fmt.Errorf("checkpoint: no complete checkpoint in %s", root)
		}
		return "", fmt.Errorf("%w in %s", ErrNoCheckpoint, root)
	}
	return all[len(all)-1], nil
}

// LatestIntact returns the newest checkpoint that passes Verify: root itself if it is a checkpoint (with no
// fallback: naming a checkpoint means that one), else the newest intact one under root. skipped explains,
// newest first, why each newer checkpoint was passed over (incomplete, or a file damaged), so that the
// caller can say that it fell back. Without an intact checkpoint it returns an error that includes why
// each one was refused.
func LatestIntact(root string) (path string, skipped []error, err error) {
	if _, err := os.Stat(filepath.Join(root, ManifestFile)); err == nil {
		if _, err := Verify(root); err != nil {
			return "", nil, err
		}
		return root, nil, nil
	}
	all, err := listNamed(root)
	if err != nil {
		return "", nil, err
	}
	if len(all) == 0 {
		return "", nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, root)
	}
	for i := len(all) - 1; i >= 0; i-- {
		if _, err := Verify(all[i]); err != nil {
			skipped = append(skipped, err)
			continue
		}
		return all[i], skipped, nil
	}
	return "", skipped, fmt.Errorf("checkpoint: no intact checkpoint in %s: %w", root, errors.Join(skipped...))
}

// parseManifest reads a manifest as Write writes it, and refuses one Write could not have written: a
// sequence below 1, a file path that is not a clean relative path inside the checkpoint ("../x", "/etc/x",
// "a//b"), a checksum that is not 64 lowercase hex digits.
func parseManifest(data []byte) (Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Manifest{}, err
	}
	if m.Sequence < 1 {
		return Manifest{}, fmt.Errorf("sequence %d: must be at least 1", m.Sequence)
	}
	for rel, sum := range m.Files {
		if !fs.ValidPath(rel) || rel == "." || !filepath.IsLocal(filepath.FromSlash(rel)) {
			return Manifest{}, fmt.Errorf("file %q: not a path inside the checkpoint", rel)
		}
		if !isSHA256Hex(sum) {
			return Manifest{}, fmt.Errorf("file %s: checksum %q is not a SHA-256 in lowercase hex", rel, sum)
		}
	}
	return m, nil
}

func isSHA256Hex(s string) bool {
	return len(s) == 2*sha256.Size && strings.Trim(s, "0123456789abcdef") == ""
}

// Verify checks that dir holds every file its manifest lists, with the recorded checksum. A manifest that
// names a file outside dir is corrupt: Verify reads nothing outside the checkpoint.
func Verify(dir string) (Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: %s is incomplete (no readable %s): %w", dir, ManifestFile, err)
	}
	m, err := parseManifest(data)
	if err != nil {
		return m, fmt.Errorf("checkpoint: %s: corrupt %s: %w", dir, ManifestFile, err)
	}
	for rel, want := range m.Files {
		got, err := hashFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return m, fmt.Errorf("checkpoint: %s: %w", dir, err)
		}
		if got != want {
			return m, fmt.Errorf("checkpoint: %s: file %s is damaged (checksum mismatch)", dir, rel)
		}
	}
	return m, nil
}

func sequenceOf(path string) int {
	name := filepath.Base(path)
	if !strings.HasPrefix(name, Prefix) {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimPrefix(name, Prefix))
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// removeStaleTemps deletes temporary directories left by writers that were killed.
func removeStaleTemps(root string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), tempPrefix) {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// WriteFile writes data to path and fsyncs it.
func WriteFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func writeFileSync(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteFile(path, data)
}

func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func syncAndHash(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
