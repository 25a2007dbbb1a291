package accel

// SetBlocksWritten installs fn as the hook a sharded save runs on every rank once its blocks are written
// (nil removes it), for the external tests' failure injection.
func SetBlocksWritten(fn func(rank int) error) { blocksWritten = fn }
