package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMinimalLearnsTheLine runs the program and checks it found y = 3x − 1.
func TestMinimalLearnsTheLine(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(&out, 20))
	assert.Contains(t, out.String(), "learned y = 3.00x -1.00 after 160 optimizer steps")
}
