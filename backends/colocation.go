package backends

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ranks that share a kernel share its processors, whatever the launcher's hosts say: containers, or the
// network namespaces of an emulated cluster, each look like a node of their own to mpirun, which then
// counts one rank per node and never calls the job oversubscribed. Open finds them by the kernel's boot id,
// which every namespace and container on one kernel reads alike, and compares their number with the
// processors their affinity masks allow between them (cpusets that split a machine keep ranks apart).

// maskWords bounds the processors compared: 64 × 16 = 1,024.
const maskWords = 16

// machineSlot is what each rank contributes: its kernel's boot id (two words) and its affinity mask, in
// int64 words, the element kind every engine moves.
type machineSlot [2 + maskWords]int64

// localMachineSlot reads this process's kernel boot id and processor mask.
func localMachineSlot() (machineSlot, error) {
	var slot machineSlot
	raw, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return slot, err
	}
	id := strings.ReplaceAll(strings.TrimSpace(string(raw)), "-", "")
	if len(id) != 32 {
		return slot, fmt.Errorf("backends: unexpected boot id %q", id)
	}
	b, err := hex.DecodeString(id)
	if err != nil || len(b) != 16 {
		return slot, fmt.Errorf("backends: unexpected boot id %q", id)
	}
	slot[0], slot[1] = int64(binary.LittleEndian.Uint64(b[:8])), int64(binary.LittleEndian.Uint64(b[8:]))
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return slot, err
	}
	for cpu := range maskWords * 64 {
		if set.IsSet(cpu) {
			slot[2+cpu/64] |= 1 << (cpu % 64)
		}
	}
	return slot, nil
}

// KernelShare is what a rank shares its kernel with: the job's ranks on it (itself included) and the
// processors their affinity masks allow between them. Zero when the rank could not read its machine.
type KernelShare struct {
	Ranks, CPUs int
}

// Oversubscribed reports whether the ranks outnumber the processors.
func (k KernelShare) Oversubscribed() bool { return k.CPUs > 0 && k.Ranks > k.CPUs }

// ThreadsPerRank is the compute threads each rank may use so that the ranks on the kernel never need more
// than its processors: at least 1, 0 when the share is unknown.
func (k KernelShare) ThreadsPerRank() int {
	if k.Ranks == 0 || k.CPUs == 0 {
		return 0
	}
	return max(1, k.CPUs/k.Ranks)
}

// kernelShareOf is rank's KernelShare, given every rank's slot.
func kernelShareOf(slots []machineSlot, rank int) KernelShare {
	mine := slots[rank]
	if mine[0] == 0 && mine[1] == 0 {
		return KernelShare{}
	}
	var union [maskWords]int64
	var share KernelShare
	for _, s := range slots {
		if s[0] != mine[0] || s[1] != mine[1] {
			continue
		}
		share.Ranks++
		for i := range union {
			union[i] |= s[2+i]
		}
	}
	for _, w := range union {
		share.CPUs += bits.OnesCount64(uint64(w))
	}
	return share
}

// kernelShare gathers every rank's slot through the engine (before any Communicator counts a call) and
// returns this rank's KernelShare.
func kernelShare(engine Engine) (KernelShare, error) {
	// Every rank takes part, even one that cannot read its machine (another operating system, a sandbox
	// without /proc): it sends zeros, which match no kernel.
	slot, _ := localMachineSlot()
	all := make([]machineSlot, engine.Size())
	req, err := engine.StartAllGather(BufferOf(slot[:]), BufferOf(unsafe.Slice(&all[0][0], len(all)*len(slot))))
	if err != nil {
		return KernelShare{}, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		done, err := req.Test()
		if err != nil {
			return KernelShare{}, err
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			return KernelShare{}, errors.New("backends: the ranks did not all open the engine within 5 minutes")
		}
		runtime.Gosched()
	}
	return kernelShareOf(all, engine.Rank()), nil
}

// oversubscribable is an engine that polls differently when its ranks outnumber their processors: Open
// tells it so when the launcher's topology did not (the mpi engine polls once per Test instead of spinning).
type oversubscribable interface {
	SetOversubscribed()
}
