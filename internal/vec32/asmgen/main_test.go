package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGeneratedFileIsCurrent fails when vec32_amd64.s is not what this generator writes: run `go generate`
// in package vec32 after changing the generator.
func TestGeneratedFileIsCurrent(t *testing.T) {
	current, err := os.ReadFile("../vec32_amd64.s")
	require.NoError(t, err)
	require.Equal(t, string(Generate()), string(current), "vec32_amd64.s is stale: run go generate in package vec32")
}
