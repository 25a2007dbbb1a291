//go:build !blas

package blas

import "testing"

// float32Kernels runs test once: without OpenBLAS float32 products have one kernel (the tiles, or gonum).
func float32Kernels(t *testing.T, test func(t *testing.T)) { test(t) }

// forceFloat32Tiles does nothing: without OpenBLAS there is no other float32 kernel to choose.
func forceFloat32Tiles(bool) (restore func()) { return func() {} }

// tilesBesideOpenBLAS is false: without OpenBLAS there is one float32 kernel.
func tilesBesideOpenBLAS() bool { return false }
