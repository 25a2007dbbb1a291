package backends

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func slotOf(boot int64, cpus ...int) machineSlot {
	s := machineSlot{boot, boot ^ 0x5a}
	for _, c := range cpus {
		s[2+c/64] |= 1 << (c % 64)
	}
	return s
}

func TestOversubscribedKernel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slots []machineSlot
		rank  int
		want  bool
	}{
		{"four emulated hosts on one 2-core kernel", []machineSlot{slotOf(1, 0, 1), slotOf(1, 0, 1), slotOf(1, 0, 1), slotOf(1, 0, 1)}, 2, true},
		{"two emulated hosts on one 2-core kernel", []machineSlot{slotOf(1, 0, 1), slotOf(1, 0, 1)}, 0, false},
		{"four real machines of 2 cores", []machineSlot{slotOf(1, 0, 1), slotOf(2, 0, 1), slotOf(3, 0, 1), slotOf(4, 0, 1)}, 3, false},
		{"cpusets split the kernel between its ranks", []machineSlot{slotOf(1, 0), slotOf(1, 1), slotOf(1, 2), slotOf(1, 3)}, 1, false},
		{"three ranks pinned to one core of four", []machineSlot{slotOf(1, 0), slotOf(1, 0), slotOf(1, 0), slotOf(2, 0, 1, 2, 3)}, 0, true},
		{"the rank on the roomy machine of that job", []machineSlot{slotOf(1, 0), slotOf(1, 0), slotOf(1, 0), slotOf(2, 0, 1, 2, 3)}, 3, false},
		{"a processor past the first word", []machineSlot{slotOf(1, 100), slotOf(1, 101), slotOf(1, 100)}, 0, true},
		{"a rank that could not read its machine", []machineSlot{{}, {}, {}}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, kernelShareOf(tc.slots, tc.rank).Oversubscribed())
		})
	}
}

func TestLocalMachineSlot(t *testing.T) {
	slot, err := localMachineSlot()
	require.NoError(t, err, "this package's tests run on Linux")
	assert.False(t, slot[0] == 0 && slot[1] == 0, "a boot id")
	cpus := 0
	for _, w := range slot[2:] {
		for ; w != 0; w &= w - 1 {
			cpus++
		}
	}
	assert.Positive(t, cpus, "at least one processor in the affinity mask")
}

func TestKernelShareThreads(t *testing.T) {
	for _, tc := range []struct {
		name        string
		slots       []machineSlot
		rank        int
		want        KernelShare
		wantThreads int
	}{
		{"two emulated hosts on one 2-core kernel", []machineSlot{slotOf(1, 0, 1), slotOf(1, 0, 1)}, 1, KernelShare{Ranks: 2, CPUs: 2}, 1},
		{"two hosts of 8 cores", []machineSlot{slotOf(1, 0, 1, 2, 3, 4, 5, 6, 7), slotOf(2, 0, 1, 2, 3, 4, 5, 6, 7)}, 0, KernelShare{Ranks: 1, CPUs: 8}, 8},
		{"four ranks on one 2-core kernel", []machineSlot{slotOf(1, 0, 1), slotOf(1, 0, 1), slotOf(1, 0, 1), slotOf(1, 0, 1)}, 3, KernelShare{Ranks: 4, CPUs: 2}, 1},
		{"three containers on a 6-core kernel", []machineSlot{slotOf(7, 0, 1, 2, 3, 4, 5), slotOf(7, 0, 1, 2, 3, 4, 5), slotOf(7, 0, 1, 2, 3, 4, 5)}, 2, KernelShare{Ranks: 3, CPUs: 6}, 2},
		{"a rank that could not read its machine", []machineSlot{{}, slotOf(1, 0)}, 0, KernelShare{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := kernelShareOf(tc.slots, tc.rank)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantThreads, got.ThreadsPerRank())
		})
	}
}
