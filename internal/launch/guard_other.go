//go:build !linux

package launch

import (
	"context"
	"os/exec"
)

// guarded returns cmd unchanged where the kernel cannot signal a child when its parent dies.
func guarded(_ context.Context, cmd *exec.Cmd) *exec.Cmd { return cmd }
