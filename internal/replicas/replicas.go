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
// variable's name, shape and dtype). When they differ, every rank returns the same error, which names the
// first line where the ranks disagree and which ranks have which version of it, so no rank goes on into a
// collective that the others will not join.
func CheckSameSignature(comm *backends.Communicator, what string, lines []string) error {
	all, err := gatherIfDifferent(comm, what, lines)
	if err != nil || all == nil {
		return err
	}
	groups := groupRanks(all, firstDisagreement(all))
	return fmt.Errorf("replicas: %s differ across ranks: %s", what,
		describeGroups(groups, func(value string) string { return fmt.Sprintf("%q", value) }))
}

// describeGroups says what each group of ranks has, "ranks 0 and 2 have X; rank 1 has Y", with each
// group's value put into words by describe.
func describeGroups(groups []rankGroup, describe func(value string) string) string {
	parts := make([]string, len(groups))
	for g, grp := range groups {
		verb := "has"
		if len(grp.ranks) > 1 {
			verb = "have"
		}
		parts[g] = fmt.Sprintf("%s %s %s", RankList(grp.ranks, 0), verb, describe(grp.value))
	}
	return strings.Join(parts, "; ")
}

// Setting is one setting that every rank must share, for CheckSameSettings.
type Setting struct {
	Name  string
	Value string
}

// CheckSameSettings verifies that every rank has the same settings, in the same order. When they differ,
// every rank returns the same error naming the first setting the ranks disagree on and each rank's value.
func CheckSameSettings(comm *backends.Communicator, settings []Setting) error {
	lines := make([]string, len(settings))
	for i, s := range settings {
		lines[i] = s.Name + "\x00" + s.Value
	}
	all, err := gatherIfDifferent(comm, "settings", lines)
	if err != nil || all == nil {
		return err
	}
	i := firstDisagreement(all)
	name := "the number of settings"
	for _, lines := range all {
		if i < len(lines) {
			name, _, _ = strings.Cut(lines[i], "\x00")
			break
		}
	}
	describe := func(value string) string {
		setting, value, found := strings.Cut(value, "\x00")
		switch {
		case !found:
			return "nothing"
		case setting != name:
			return fmt.Sprintf("%s instead", setting)
		}
		return value
	}
	return fmt.Errorf("replicas: the ranks disagree on %s: %s", name, describeGroups(groupRanks(all, i), describe))
}

// gatherIfDifferent compares the ranks' lines by hash and, only if they differ, gathers every rank's lines
// (nil when they are the same everywhere).
func gatherIfDifferent(comm *backends.Communicator, what string, lines []string) ([][]string, error) {
	size := comm.Size()
	if size == 1 {
		return nil, nil
	}
	text := []byte(strings.Join(lines, "\n"))
	sum := sha256.Sum256(text)
	sums := make([]byte, len(sum)*size)
	if err := comm.AllGather(backends.BufferOf(sum[:]), backends.BufferOf(sums)); err != nil {
		return nil, fmt.Errorf("replicas: comparing %s across ranks: %w", what, err)
	}
	same := true
	for r := range size {
		if !bytes.Equal(sums[r*len(sum):(r+1)*len(sum)], sums[:len(sum)]) {
			same = false
			break
		}
	}
	if same {
		return nil, nil
	}
	// Rare path: exchange the full texts to say what differs.
	texts, err := AllGatherBytes(comm, text)
	if err != nil {
		return nil, fmt.Errorf("replicas: %s differ across ranks, and exchanging them failed: %w", what, err)
	}
	all := make([][]string, size)
	for r := range size {
		all[r] = strings.Split(string(texts[r]), "\n")
	}
	return all, nil
}

// firstDisagreement is the index of the first line on which the ranks do not all agree.
func firstDisagreement(all [][]string) int {
	longest := 0
	for _, lines := range all {
		longest = max(longest, len(lines))
	}
	for i := range longest {
		for _, lines := range all[1:] {
			if lineAt(lines, i) != lineAt(all[0], i) {
				return i
			}
		}
	}
	return longest
}

type rankGroup struct {
	value string
	ranks []int
}

// groupRanks groups the ranks by their line i, in the order of each group's lowest rank.
func groupRanks(all [][]string, i int) []rankGroup {
	var groups []rankGroup
	for r, lines := range all {
		v := lineAt(lines, i)
		found := false
		for g := range groups {
			if groups[g].value == v {
				groups[g].ranks = append(groups[g].ranks, r)
				found = true
				break
			}
		}
		if !found {
			groups = append(groups, rankGroup{value: v, ranks: []int{r}})
		}
	}
	return groups
}

func lineAt(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "<nothing>"
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
		err = value.MutableBytes(func(data []byte) { bcastErr = comm.Broadcast(backends.BufferOf(data), root) })
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
