package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The committed files the generator writes, relative to this directory.
const (
	vec32Dir    = ".."
	gemmtileDir = "../../../cpu/internal/gemmtile"
)

// TestGeneratedFileIsCurrent fails when vec32_amd64.s is not what this generator writes: run `go generate`
// in package vec32 after changing the generator.
func TestGeneratedFileIsCurrent(t *testing.T) {
	current, err := os.ReadFile(filepath.Join(vec32Dir, "vec32_amd64.s"))
	require.NoError(t, err)
	require.Equal(t, string(Generate()), string(current), "vec32_amd64.s is stale: run go generate in package vec32")
}

// TestRegeneratedFilesMatchCommitted runs the command as `go generate` does, with the arguments of each
// package's //go:generate line, into a temporary directory, and compares every file it writes with the
// committed one: neither package's assembly can drift from the generator (nor be edited by hand).
func TestRegeneratedFilesMatchCommitted(t *testing.T) {
	tmp := t.TempDir()
	require.NoError(t, run([]string{"-out", filepath.Join(tmp, "vec32_amd64.s")}))
	tilesDir := filepath.Join(tmp, "gemmtile")
	require.NoError(t, os.Mkdir(tilesDir, 0o755))
	require.NoError(t, run([]string{"-tiles", tilesDir}))

	for _, f := range []struct{ generated, committed, pkg string }{
		{filepath.Join(tmp, "vec32_amd64.s"), filepath.Join(vec32Dir, "vec32_amd64.s"), "vec32"},
		{filepath.Join(tilesDir, "tile_amd64.s"), filepath.Join(gemmtileDir, "tile_amd64.s"), "gemmtile"},
		{filepath.Join(tilesDir, "tile512_amd64.s"), filepath.Join(gemmtileDir, "tile512_amd64.s"), "gemmtile"},
	} {
		generated, err := os.ReadFile(f.generated)
		require.NoError(t, err)
		committed, err := os.ReadFile(f.committed)
		require.NoError(t, err)
		require.Equal(t, string(generated), string(committed), "%s is stale: run go generate in package %s",
			f.committed, f.pkg)
	}
	entries, err := os.ReadDir(tilesDir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "-tiles writes tile_amd64.s and tile512_amd64.s, nothing else")
}

// TestGenerateDirectives checks that each package's //go:generate line runs this command with the
// arguments the test above uses, so that `go generate` rewrites the files it compares.
func TestGenerateDirectives(t *testing.T) {
	for _, d := range []struct{ file, line string }{
		{filepath.Join(vec32Dir, "vec32_amd64.go"), "//go:generate go run ./asmgen -out vec32_amd64.s\n"},
		{filepath.Join(gemmtileDir, "tile_amd64.go"),
			"//go:generate go run github.com/goaccel/goaccel/internal/vec32/asmgen -tiles .\n"},
	} {
		text, err := os.ReadFile(d.file)
		require.NoError(t, err)
		require.Contains(t, string(text), d.line, "%s", d.file)
	}
}

// TestGeneratedFilesBuildOnlyWithAssembly: every generated file carries the constraint that keeps it out
// of other architectures and purego builds, whose Go fallbacks declare the same functions.
func TestGeneratedFilesBuildOnlyWithAssembly(t *testing.T) {
	texts := [][]byte{Generate()}
	for _, f := range GenerateTiles() {
		texts = append(texts, f.Text)
	}
	for _, text := range texts {
		require.Contains(t, string(text), "\n//go:build amd64 && !purego\n")
	}
}

func TestRunRejectsStrayArguments(t *testing.T) {
	require.Error(t, run([]string{"-out", filepath.Join(t.TempDir(), "x.s"), "extra"}))
}
