// Package replicas keeps the ranks' copies of a model identical: it broadcasts variables from one rank,
// compares what the ranks describe (bucket plans, checkpoint layouts) and checks weights bitwise.
package replicas

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/backends"
)

// CheckSameSignature verifies that every rank describes the same thing (one line per item, such as a
// variable's name, shape and dtype). When they differ, every rank returns an error naming the first
// line where it differs from rank 0 — or, on rank 0, where the first differing rank differs — so no rank
// goes on into a collective that the others will not join.
func CheckSameSignature(comm *backends.Communicator, what string, lines []string) error {
	size := comm.Size()
	if size == 1 {
		return nil
	}
	text := []byte(strings.Join(lines, "\n"))
	sum := sha256.Sum256(text)
	sums := make([]byte, len(sum)*size)
	if err := comm.AllGather(sum[:], sums); err != nil {
		return fmt.Errorf("replicas: comparing %s across ranks: %w", what, err)
	}
	firstDiffering := -1
	for r := range size {
		if !bytes.Equal(sums[r*len(sum):(r+1)*len(sum)], sums[:len(sum)]) {
			firstDiffering = r
			break
		}
	}
	if firstDiffering < 0 {
		return nil
	}
	// Rare path: exchange the full texts (lengths first, then padded to the longest) to say what differs.
	lengths := make([]int64, size)
	if err := comm.AllGather([]int64{int64(len(text))}, lengths); err != nil {
		return fmt.Errorf("replicas: %s differ across ranks, and exchanging them failed: %w", what, err)
	}
	longest := int64(0)
	for _, n := range lengths {
		longest = max(longest, n)
	}
	padded := make([]byte, longest)
	copy(padded, text)
	all := make([]byte, longest*int64(size))
	if err := comm.AllGather(padded, all); err != nil {
		return fmt.Errorf("replicas: %s differ across ranks, and exchanging them failed: %w", what, err)
	}
	linesOf := func(r int) []string {
		start := int64(r) * longest
		return strings.Split(string(all[start:start+lengths[r]]), "\n")
	}
	me, other := comm.Rank(), 0
	if me == 0 {
		other = firstDiffering
	}
	if a, b, differ := FirstDifference(linesOf(me), linesOf(other)); differ {
		return fmt.Errorf("replicas: %s differ across ranks: rank %d has %q where rank %d has %q", what, me, a,
			other, b)
	}
	return fmt.Errorf("replicas: %s differ across ranks %d and %d", what, me, other)
}

// FirstDifference returns the first line where a and b differ ("<nothing>" standing for a missing line),
// and whether they differ at all.
func FirstDifference(a, b []string) (lineA, lineB string, differ bool) {
	at := func(lines []string, i int) string {
		if i < len(lines) {
			return lines[i]
		}
		return "<nothing>"
	}
	for i := range max(len(a), len(b)) {
		if lineA, lineB = at(a, i), at(b, i); lineA != lineB {
			return lineA, lineB, true
		}
	}
	return "", "", false
}

// variableSignature describes variables for CheckSameSignature.
func variableSignature(vars []*context.Variable) []string {
	lines := make([]string, len(vars))
	for i, v := range vars {
		lines[i] = fmt.Sprintf("variable %s %s", v.ScopeAndName(), v.Shape())
	}
	return lines
}

// BroadcastVariables copies root's values of vars to every rank, after checking that every rank has the
// same variables: replicas must start identical whatever each rank initialised.
func BroadcastVariables(comm *backends.Communicator, vars []*context.Variable, root int) error {
	if comm.Size() == 1 {
		return nil
	}
	if err := CheckSameSignature(comm, "model variables", variableSignature(vars)); err != nil {
		return err
	}
	for _, v := range vars {
		value, err := v.Value()
		if err != nil {
			return fmt.Errorf("replicas: variable %q has no value to broadcast: %w", v.ScopeAndName(), err)
		}
		var bcastErr error
		err = value.MutableBytes(func(data []byte) { bcastErr = comm.Broadcast(data, root) })
		if err == nil {
			err = bcastErr
		}
		if err != nil {
			return fmt.Errorf("replicas: broadcasting variable %q: %w", v.ScopeAndName(), err)
		}
	}
	return nil
}

// VariablesDigest hashes the names and values of vars. Ranks compare digests to prove that replicas hold
// bitwise-identical weights.
func VariablesDigest(vars []*context.Variable) ([32]byte, error) {
	h := sha256.New()
	for _, v := range vars {
		value, err := v.Value()
		if err != nil {
			return [32]byte{}, fmt.Errorf("replicas: variable %q: %w", v.ScopeAndName(), err)
		}
		h.Write([]byte(v.ScopeAndName()))
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(value.Shape().Memory()))
		h.Write(n[:])
		if err := value.ConstBytes(func(data []byte) { h.Write(data) }); err != nil {
			return [32]byte{}, err
		}
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out, nil
}

// CheckReplicasInSync compares every variable's value across ranks and returns an error naming the first
// variable that differs from rank 0's, on every rank.
func CheckReplicasInSync(comm *backends.Communicator, vars []*context.Variable) error {
	if comm.Size() == 1 {
		return nil
	}
	lines := make([]string, len(vars))
	for i, v := range vars {
		d, err := VariablesDigest([]*context.Variable{v})
		if err != nil {
			return err
		}
		lines[i] = fmt.Sprintf("%s sha256:%x", v.ScopeAndName(), d[:8])
	}
	if err := CheckSameSignature(comm, "replica weights", lines); err != nil {
		return fmt.Errorf("replicas: replicas diverged: %w", err)
	}
	return nil
}
