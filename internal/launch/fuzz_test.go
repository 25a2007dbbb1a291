package launch

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These fuzz targets run their seeds under go test; `go test -run='^$' -fuzz=FuzzX ./launch/` explores
// further. Each checks what a successful parse promises, not only that it returns.

// requireHostName fails unless name is one checkHostName accepts: it never starts with '-', and holds no
// ',' or ':' that mpirun's --host would split it at. (Cheap: it runs for up to a million names.)
func requireHostName(t *testing.T, name string) {
	t.Helper()
	if err := checkHostName(name); err != nil || strings.HasPrefix(name, "-") || strings.ContainsAny(name, ",:") {
		t.Fatalf("host %q was accepted (%v)", name, err)
	}
}

func FuzzExpandNodeList(f *testing.F) {
	for _, seed := range []string{
		"node1", "node[1-3,5],gpu-a[01-02]b", "n[098-101]", "rack[1-2]-n[1-2]", "a,b[1-2],c", " a , b ",
		"10.0.0.[1-4]", "n[0-1023][0-1023]", "n[0-99999][0-99999]", "n[0-9223372036854775807]",
		"n[99999999999999999999]", "node[1-3", "node1-3]", "node[3-1]", "n[]", "n[+1]", "n[-1]", "a,,b", "",
		"-oProxyCommand=/tmp/x", "n1,-n[1-2]", "n[[1]]", "n]1[", "a b", "n[1,,2]", "n[1-2-3]", "\xff",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, list string) {
		names, err := ExpandNodeList(list)
		if err != nil {
			require.Nil(t, names)
			return
		}
		require.NotEmpty(t, names)
		require.LessOrEqual(t, len(names), maxListEntries)
		for _, name := range names {
			requireHostName(t, name)
		}
		if !strings.ContainsAny(list, "[]") {
			want := strings.Split(list, ",")
			for i := range want {
				want[i] = strings.TrimSpace(want[i])
			}
			require.Equal(t, want, names, "a list without brackets is its comma-separated names")
		}
		if len(names) <= 1000 {
			again, err := ExpandNodeList(strings.Join(names, ","))
			require.NoError(t, err)
			require.Equal(t, names, again, "the expanded names, listed, expand to themselves")
		}
	})
}

// taskPart is one N or N(xM) of a task list, read independently of ExpandTasksPerNode.
var taskPart = regexp.MustCompile(`^([0-9]+)(?:\(x([0-9]+)\))?$`)

func FuzzExpandTasksPerNode(f *testing.F) {
	for _, seed := range []string{
		"4", "4(x2),2", "2(x3),1", "1,2,3", "1(x1048575),2", "1048576", "4(x0)", "4(2)", "", "+4", "4(x-1)",
		"1(x1000000000000)", "1(x1048576),2", "99999999999999999999(x2)", "1048577", "4(x2", "(x2)", "4(x)",
		"4(x2)(x3)", ",", "4,", " 4",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		counts, err := ExpandTasksPerNode(value)
		if err != nil {
			require.Nil(t, counts)
			return
		}
		declared := 0
		for _, part := range strings.Split(value, ",") {
			m := taskPart.FindStringSubmatch(part)
			require.NotNil(t, m, "%q was accepted, but its part %q is not N or N(xM)", value, part)
			times := 1
			if m[2] != "" {
				times, err = strconv.Atoi(m[2])
				require.NoError(t, err)
			}
			declared += times
		}
		require.Len(t, counts, declared, "one count per node the list declares")
		require.LessOrEqual(t, len(counts), maxListEntries)
		// Compressed again as Slurm writes it, the counts expand to themselves.
		var parts []string
		for i := 0; i < len(counts); {
			require.GreaterOrEqual(t, counts[i], 1)
			require.LessOrEqual(t, counts[i], maxSlots)
			j := i
			for j < len(counts) && counts[j] == counts[i] {
				j++
			}
			if j-i == 1 {
				parts = append(parts, strconv.Itoa(counts[i]))
			} else {
				parts = append(parts, fmt.Sprintf("%d(x%d)", counts[i], j-i))
			}
			i = j
		}
		again, err := ExpandTasksPerNode(strings.Join(parts, ","))
		require.NoError(t, err)
		require.Equal(t, counts, again)
	})
}

func FuzzParseHosts(f *testing.F) {
	for _, seed := range []string{
		"node1:4,node2:4", "a, b:2 ,10.0.0.7", "gpu-01.cluster.local:8", "", " ", "a:0", "a:x", "a,,b",
		"a,b,a:2", "-a", "-oProxyCommand=/tmp/evil.sh:1", "a:+4", "a:1048576", "a:1048577",
		"a:99999999999999999999", "a:1:2", "a b", "fe80::1", "a:", ":4", "\xff",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		hosts, err := ParseHosts(spec)
		if err != nil {
			require.Nil(t, hosts)
			return
		}
		require.Len(t, hosts, strings.Count(spec, ",")+1, "one host per comma-separated item")
		seen := map[string]bool{}
		for _, h := range hosts {
			requireHostName(t, h.Name)
			require.False(t, seen[h.Name], "host %q twice", h.Name)
			seen[h.Name] = true
			require.GreaterOrEqual(t, h.Slots, 1)
			require.LessOrEqual(t, h.Slots, maxSlots)
		}
		again, err := ParseHosts(hostList(hosts))
		require.NoError(t, err)
		require.Equal(t, hosts, again, "mpirun's --host value reads back as the same hosts")
	})
}

func FuzzParseHostfile(f *testing.F) {
	for _, seed := range []string{
		"node1 slots=4\nnode2 slots=4 max_slots=8\n", "# rack 1\nnode1:4\nnode2:2 # small\n\n10.0.0.7\n",
		"node1 slots = 4\r\n\tnode2\tcount=2\r\n", "a slots=2\na slots=2", "# Zürich\na\n",
		"node1\n-oProxyCommand=/tmp/evil.sh slots=1\n", "node1 -oProxyCommand=x\n", "node1 user=-oX\n",
		"\x7fELF\x02\x01\x01\x00\x00\x00\n", "\xff\xfe n\x00o\x00d\x00e\x00\n", "a # \x00\n",
		"this is not a hostfile\n", "alice@node1\n", "node1 slots=x\n", "node1:0\n", "node1:2 slots=2\n",
		"node1 slots=99999999999999999999\n", "node1\u00a0slots=4\n", "", "\n\n# only comments\n", "a=b\n",
		"a slots=\n", "a =\n", "a:1:2\n", "node1 max-slots=4 user=alice port=22\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		hosts, err := parseHostfile("fuzz", bytes.NewReader(data))
		if err != nil {
			require.Nil(t, hosts)
			require.True(t, strings.HasPrefix(err.Error(), "launch: hostfile fuzz"), "the error names the file: %v", err)
			return
		}
		require.True(t, utf8.Valid(data), "an accepted hostfile is text")
		for _, r := range string(data) {
			require.False(t, unicode.IsControl(r) && !strings.ContainsRune("\t\r\n", r), "an accepted hostfile holds %q", r)
		}
		lines := 0
		for line := range strings.SplitSeq(string(data), "\n") {
			line, _, _ = strings.Cut(line, "#")
			if strings.Trim(line, " \t\r") != "" {
				lines++
			}
		}
		require.Len(t, hosts, lines, "one host per line that is not blank or a comment")
		require.LessOrEqual(t, len(hosts), maxListEntries)
		var again strings.Builder
		for _, h := range hosts {
			requireHostName(t, h.Name)
			require.GreaterOrEqual(t, h.Slots, 0)
			require.LessOrEqual(t, h.Slots, maxSlots)
			again.WriteString(h.Name)
			if h.Slots > 0 {
				fmt.Fprintf(&again, " slots=%d", h.Slots)
			}
			again.WriteString("\n")
		}
		reread, err := parseHostfile("again", strings.NewReader(again.String()))
		require.NoError(t, err)
		assert.Equal(t, hosts, reread, "the hosts, written as a hostfile, read back the same")
	})
}
