package replicas

import (
	"fmt"
	"strings"

	"github.com/goaccel/goaccel/backends"
)

// Agree is a collective vote on a step that every rank checked on its own: each rank passes its own
// outcome (nil for success), and every rank returns nil only if every rank succeeded. Otherwise every rank
// returns the same error, naming which ranks failed and why, so that no rank goes on to apply what another
// rank refused.
func Agree(comm *backends.Communicator, what string, local error) error {
	size := comm.Size()
	text := ""
	if local != nil {
		text = local.Error()
		if text == "" {
			text = "failed"
		}
	}
	if size == 1 {
		if local != nil {
			return fmt.Errorf("%s: %w", what, local)
		}
		return nil
	}
	all, err := AllGatherBytes(comm, []byte(text))
	if err != nil {
		return fmt.Errorf("%s: agreeing on the outcome across ranks: %w", what, err)
	}
	// Group the ranks by message: ranks that refuse for the same reason (a setting that differs, a damaged
	// file) are named together, with the reason once.
	var order []string
	byText := map[string][]int{}
	for r := range size {
		msg := string(all[r])
		if msg == "" {
			continue
		}
		if _, seen := byText[msg]; !seen {
			order = append(order, msg)
		}
		byText[msg] = append(byText[msg], r)
	}
	if len(order) == 0 {
		return nil
	}
	parts := make([]string, len(order))
	for i, msg := range order {
		parts[i] = fmt.Sprintf("%s: %s", RankList(byText[msg], size), msg)
	}
	return &refusal{msg: what + ": " + strings.Join(parts, "; "), local: local}
}

// refusal is Agree's error: its text names every failing rank; it unwraps to this rank's own error, if
// this rank failed, so that errors.Is and errors.As still find it.
type refusal struct {
	msg   string
	local error
}

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return e.local }

// RankList names a set of ranks for messages: "rank 2", "ranks 0 and 3", "ranks 0, 1 and 3", or "every
// rank" when it holds all size of them.
func RankList(ranks []int, size int) string {
	if len(ranks) == size && size > 1 {
		return "every rank"
	}
	names := make([]string, len(ranks))
	for i, r := range ranks {
		names[i] = fmt.Sprint(r)
	}
	switch len(names) {
	case 0:
		return "no rank"
	case 1:
		return "rank " + names[0]
	}
	return "ranks " + strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// AllGatherBytes gives every rank every rank's data, whatever its length: the lengths travel first, then
// the data padded to the longest (not at all when every rank's is empty). Collective.
func AllGatherBytes(comm *backends.Communicator, data []byte) ([][]byte, error) {
	size := comm.Size()
	if size == 1 {
		return [][]byte{data}, nil
	}
	lengths := make([]int64, size)
	if err := comm.AllGather(backends.BufferOf([]int64{int64(len(data))}), backends.BufferOf(lengths)); err != nil {
		return nil, err
	}
	longest := int64(0)
	for _, n := range lengths {
		longest = max(longest, n)
	}
	all := make([][]byte, size)
	if longest == 0 {
		return all, nil
	}
	padded := make([]byte, longest)
	copy(padded, data)
	buf := make([]byte, longest*int64(size))
	if err := comm.AllGather(backends.BufferOf(padded), backends.BufferOf(buf)); err != nil {
		return nil, err
	}
	for r := range size {
		start := int64(r) * longest
		all[r] = buf[start : start+lengths[r]]
	}
	return all, nil
}
