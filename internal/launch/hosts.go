package launch

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Host is a machine of a job and the number of processes it takes (its slots), as mpirun's --host
// node1:4 names them.
type Host struct {
	Name  string
	Slots int
}

// String is the host as mpirun's --host takes it: "node1:4".
func (h Host) String() string { return h.Name + ":" + strconv.Itoa(h.Slots) }

// hostName matches what may name a host: a hostname (letters, digits, '-', '.', '_') or an IPv4 address.
// IPv6 addresses are left out: their colons cannot be told from the slots' in mpirun's --host. A name never
// starts with '-': ssh, and mpirun's other launch agents, would read it as an option
// ("-oProxyCommand=...", which runs a command).
var hostName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// maxSlots bounds the slots of one host (and the task count of one Slurm node): no machine runs a million
// processes of one job, and a count beyond it is a typo or garbage, which must not become an mpirun -np
// or a sum of slots that overflows.
const maxSlots = 1 << 20

// ParseHosts reads a host list as `accel launch --hosts` takes it: comma-separated NAME or NAME:SLOTS, slots
// 1 when left out ("node1:4,node2:4", "a,b,c"). A name may appear once.
func ParseHosts(spec string) ([]Host, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("launch: empty host list: write NAME[:SLOTS],... (node1:4,node2:4)")
	}
	var hosts []Host
	seen := map[string]bool{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		name, slotsText, hasSlots := strings.Cut(item, ":")
		h := Host{Name: name, Slots: 1}
		if hasSlots {
			n, err := parseSlots(slotsText)
			if err != nil {
				return nil, fmt.Errorf("launch: host %q in %q: %w", name, spec, err)
			}
			h.Slots = n
		}
		if err := checkHostName(name); err != nil {
			return nil, fmt.Errorf("%w (in %q)", err, spec)
		}
		if seen[name] {
			return nil, fmt.Errorf("launch: host %q appears twice in %q: give it once, with all its slots", name, spec)
		}
		seen[name] = true
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// checkHostName is the one check of a host name, wherever it comes from: --hosts, a hostfile, WithHosts, a
// Slurm allocation.
func checkHostName(name string) error {
	if strings.HasPrefix(name, "-") {
		return fmt.Errorf("launch: %q is not a host name: it starts with '-', which ssh and mpirun's other launch "+
			"agents would read as an option", name)
	}
	if !hostName.MatchString(name) {
		return fmt.Errorf("launch: %q is not a host name (letters, digits, '-', '.', '_') or an IPv4 address", name)
	}
	return nil
}

// parseSlots reads a host's slots: a whole number from 1 to maxSlots, in decimal digits.
func parseSlots(text string) (int, error) {
	n, err := strconv.Atoi(text)
	switch {
	case err != nil && errors.Is(err, strconv.ErrRange), err == nil && n > maxSlots:
		return 0, fmt.Errorf("slots must be at most %d, got %q", maxSlots, text)
	case err != nil || n < 1 || strings.Trim(text, "0123456789") != "":
		return 0, fmt.Errorf("slots must be a whole number of at least 1, got %q", text)
	}
	return n, nil
}

// checkHosts checks hosts given to WithHosts as ParseHosts checks --hosts' (names may repeat: mpirun adds
// up their slots).
func checkHosts(hosts []Host) error {
	for _, h := range hosts {
		if err := checkHostName(h.Name); err != nil {
			return err
		}
		if h.Slots < 1 || h.Slots > maxSlots {
			return fmt.Errorf("launch: host %q: slots must be a whole number from 1 to %d, got %d", h.Name, maxSlots, h.Slots)
		}
	}
	return nil
}

// totalSlots is the number of processes the hosts take.
func totalSlots(hosts []Host) int {
	n := 0
	for _, h := range hosts {
		n += h.Slots
	}
	return n
}

// hostList is the value of mpirun's --host (Open MPI) or -hosts (MPICH): "node1:4,node2:4".
func hostList(hosts []Host) string {
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		parts[i] = h.String()
	}
	return strings.Join(parts, ",")
}

// WithHosts runs the processes on hosts (mpirun --host node1:4,node2:4), each taking at most its slots;
// mpirun fills each host's slots in turn, so ranks 0-3 run on node1 and 4-7 on node2. With hosts, a
// process count of 0 means one process per slot, a larger count than the slots is an error (Open MPI
// refuses it: "not enough slots"), and goaccel never adds --oversubscribe. Their names are checked as
// ParseHosts checks --hosts' (none may start with '-'), their slots must be from 1 to 1048576.
func WithHosts(hosts ...Host) Option { return func(c *config) { c.hosts = append(c.hosts, hosts...) } }

// hostfileKey and hostfileValue match the words after a hostfile line's host: Open MPI's KEY=VALUE
// (slots=4, max_slots=8, user=alice). A value never starts with '-', for the reason a host name does not.
var (
	hostfileKey   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)
	hostfileValue = regexp.MustCompile(`^[A-Za-z0-9_./][A-Za-z0-9_.,:@/+-]*$`)
	// hostfileEquals is the '=' of a KEY=VALUE word, which Open MPI also reads with spaces around it.
	hostfileEquals = regexp.MustCompile(`[ \t]*=[ \t]*`)
)

// hostfileSlotKeys are the words of an Open MPI hostfile that give a host's slots.
var hostfileSlotKeys = []string{"slots", "slot", "count", "cpu"}

// readHostfile reads and checks the hostfile at path: see parseHostfile.
func readHostfile(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("launch: hostfile: %w", err)
	}
	defer f.Close()
	return parseHostfile(path, f)
}

// parseHostfile reads an Open MPI or MPICH hostfile (named path in errors): one host a line, NAME (Open MPI)
// or NAME:SLOTS (MPICH), then Open MPI's KEY=VALUE words ("node1 slots=4 max_slots=8"); '#' starts a
// comment, and blank lines are skipped. Every name is checked as --hosts' are (checkHostName), so none can
// reach ssh as an option; a line that is not text (a binary file), a word that is not KEY=VALUE, slots that
// are not a whole number, a file of no host or of more than maxListEntries hosts are errors naming the file
// and line. Each host's Slots is what its line gives (":4", slots=, count= or cpu=), 0 when the line gives
// none: mpirun then decides. A name may be on several lines (Open MPI adds up their slots).
func parseHostfile(path string, r io.Reader) ([]Host, error) {
	var hosts []Host
	scanner := bufio.NewScanner(r)
	lineNo := 0
	for scanner.Scan() {
		lineNo++
		fail := func(format string, args ...any) error {
			return fmt.Errorf("launch: hostfile %s, line %d: %s", path, lineNo, fmt.Sprintf(format, args...))
		}
		text := scanner.Text()
		if what := notText(text); what != "" {
			return nil, fail("not text (%s): a hostfile lists one host a line, NAME [slots=N]", what)
		}
		line, _, _ := strings.Cut(text, "#")
		// Split where mpirun's reader does, on ASCII blanks only: a word holding any other space is no host.
		fields := strings.FieldsFunc(hostfileEquals.ReplaceAllString(line, "="), isHostfileBlank)
		if len(fields) == 0 {
			continue
		}
		name, slotsText, hasSlots := strings.Cut(fields[0], ":")
		if err := checkHostName(name); err != nil {
			return nil, fail("%s", strings.TrimPrefix(err.Error(), "launch: "))
		}
		h := Host{Name: name}
		if hasSlots {
			n, err := parseSlots(slotsText)
			if err != nil {
				return nil, fail("host %s: %v", name, err)
			}
			h.Slots = n
		}
		for _, word := range fields[1:] {
			key, value, ok := strings.Cut(word, "=")
			if !ok || !hostfileKey.MatchString(key) || !hostfileValue.MatchString(value) {
				return nil, fail("%q after host %s is not KEY=VALUE (slots=4, max_slots=8)", word, name)
			}
			if !slices.Contains(hostfileSlotKeys, strings.ToLower(key)) {
				continue
			}
			if h.Slots != 0 {
				return nil, fail("host %s: slots given twice", name)
			}
			n, err := parseSlots(value)
			if err != nil {
				return nil, fail("host %s: %v", name, err)
			}
			h.Slots = n
		}
		if len(hosts) == maxListEntries {
			return nil, fail("more than %d hosts", maxListEntries)
		}
		hosts = append(hosts, h)
	}
	if err := scanner.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("launch: hostfile %s, line %d: longer than %d bytes: is it a hostfile?", path, lineNo+1,
				bufio.MaxScanTokenSize)
		}
		return nil, fmt.Errorf("launch: hostfile %s: %w", path, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("launch: hostfile %s names no host", path)
	}
	return hosts, nil
}

func isHostfileBlank(r rune) bool { return r == ' ' || r == '\t' || r == '\r' }

// notText describes the first thing in line that is not text, and where it is ("byte 0xff at byte 7", "'\x00'
// at byte 1"): invalid UTF-8, or a control character other than tab and carriage return (a file with CRLF
// line ends). It returns "" when the line is text.
func notText(line string) string {
	for i := 0; i < len(line); {
		r, size := utf8.DecodeRuneInString(line[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return fmt.Sprintf("byte 0x%02x at byte %d", line[i], i+1)
		case unicode.IsControl(r) && r != '\t' && r != '\r':
			return fmt.Sprintf("%q at byte %d", r, i+1)
		}
		i += size
	}
	return ""
}
