package launch

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseHostfile(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    []Host
		wantErr string
	}{
		{name: "Open MPI", text: "# rack 1\nnode1 slots=4\nnode2 slots=4 max_slots=8\n\n10.0.0.7\n",
			want: []Host{{"node1", 4}, {"node2", 4}, {"10.0.0.7", 0}}},
		{name: "MPICH", text: "node1:4\nnode2:2 # the small one\n", want: []Host{{"node1", 4}, {"node2", 2}}},
		{name: "spaces around '=', tabs, CRLF", text: "node1 slots = 4\r\n\tnode2\tcount=2\r\n",
			want: []Host{{"node1", 4}, {"node2", 2}}},
		{name: "a host on several lines", text: "a slots=2\na slots=2\n", want: []Host{{"a", 2}, {"a", 2}}},
		{name: "text in comments", text: "# Zürich, Gebäude 3\na\n", want: []Host{{"a", 0}}},
		{name: "ProxyCommand as a host", text: "node1\n-oProxyCommand=/tmp/evil.sh slots=1\n",
			wantErr: `hostfile hosts, line 2: "-oProxyCommand=/tmp/evil.sh" is not a host name: it starts with '-'`},
		{name: "a bare dash", text: "- slots=1\n", wantErr: `line 1: "-" is not a host name: it starts with '-'`},
		{name: "an option after the host", text: "node1 -oProxyCommand=x\n",
			wantErr: `line 1: "-oProxyCommand=x" after host node1 is not KEY=VALUE`},
		{name: "an option as a value", text: "node1 user=-oProxyCommand=x\n",
			wantErr: `line 1: "user=-oProxyCommand=x" after host node1 is not KEY=VALUE`},
		{name: "binary", text: "node1\n\x7fELF\x02\x01\x01\x00\x00\x00\n",
			wantErr: `line 2: not text ('\x7f' at byte 1)`},
		{name: "invalid UTF-8", text: "\xff\xfe n\x00o\x00d\x00e\x00\n", wantErr: "line 1: not text (byte 0xff at byte 1)"},
		{name: "binary in a comment", text: "a # \x00\n", wantErr: `line 1: not text ('\x00' at byte 5)`},
		{name: "garbage words", text: "node1 slots=4\nthis is not a hostfile\n",
			wantErr: `line 2: "is" after host this is not KEY=VALUE`},
		{name: "a space that is not ASCII", text: "node1\u00a0slots=4\n", wantErr: `line 1: "node1\u00a0slots=4" is not a host name`},
		{name: "a user name", text: "alice@node1\n", wantErr: `line 1: "alice@node1" is not a host name`},
		{name: "slots not a number", text: "node1 slots=x\n", wantErr: `line 1: host node1: slots must be a whole number of at least 1, got "x"`},
		{name: "no slots", text: "node1:0\n", wantErr: `got "0"`},
		{name: "too many slots", text: "node1 slots=99999999999999999999\n", wantErr: "slots must be at most 1048576"},
		{name: "slots given twice", text: "node1:2 slots=2\n", wantErr: "line 1: host node1: slots given twice"},
		{name: "a line too long", text: "a\n" + strings.Repeat("x", 70000) + "\n", wantErr: "line 2: longer than 65536 bytes"},
		{name: "empty", text: "# nothing\n\n", wantErr: "hostfile hosts names no host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseHostfile("hosts", strings.NewReader(tt.text))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestHostNamesAreNeverOptions: a host name starting with '-' is refused wherever a host name comes from.
func TestHostNamesAreNeverOptions(t *testing.T) {
	const evil = "-oProxyCommand=/tmp/evil.sh"
	tests := []struct {
		name string
		err  func() error
	}{
		{"--hosts", func() error { _, err := ParseHosts(evil + ":1"); return err }},
		{"a hostfile", func() error { _, err := parseHostfile("h", strings.NewReader(evil+" slots=1\n")); return err }},
		{"WithHosts", func() error {
			_, err := Argv(1, "./train", nil, WithFlavor(OpenMPI), WithHosts(Host{Name: evil, Slots: 1}))
			return err
		}},
		{"a Slurm node list", func() error { _, err := ExpandNodeList("n1," + evil); return err }},
		{"a Slurm node list's pattern", func() error { _, err := ExpandNodeList("-oProxyCommand=/tmp/x[1-2]"); return err }},
		{"scontrol's names", func() error {
			dir := t.TempDir()
			script := "#!/bin/sh\necho n1; echo '" + evil + "'\n"
			require.NoError(t, os.WriteFile(filepath.Join(dir, "scontrol"), []byte(script), 0o755))
			t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
			_, err := SlurmHosts([]string{"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1-2]"})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "is not a host name: it starts with '-'")
		})
	}
}

func TestProbeArgv(t *testing.T) {
	tests := []struct {
		agent []string
		want  []string
	}{
		{[]string{"ssh", "-o", "BatchMode=yes"}, []string{"ssh", "-o", "BatchMode=yes", "--", "node1", "true"}},
		{[]string{"/usr/bin/ssh", "-p", "2222"}, []string{"/usr/bin/ssh", "-p", "2222", "--", "node1", "true"}},
		{[]string{"ssh", "--"}, []string{"ssh", "--", "node1", "true"}},
		// Other agents are scripts run as AGENT HOST COMMAND..., as mpirun runs them.
		{[]string{"rsh"}, []string{"rsh", "node1", "true"}},
		{[]string{"/opt/cluster/agent", "-v"}, []string{"/opt/cluster/agent", "-v", "node1", "true"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.agent, " "), func(t *testing.T) {
			assert.Equal(t, tt.want, probeArgv(tt.agent, "node1"))
		})
	}
}

// fakeLauncher writes an mpirun that says it is Open MPI and an ssh, both of which only append their
// arguments to a file of their own (dir/mpirun.ran, dir/ssh.ran) and succeed.
func fakeLauncher(t *testing.T) (dir, mpirun, ssh string) {
	t.Helper()
	dir = t.TempDir()
	for _, name := range []string{"mpirun", "ssh"} {
		script := "#!/bin/sh\necho \"$*\" >> '" + filepath.Join(dir, name+".ran") + "'\n" +
			"case \"$1\" in --version) echo 'mpirun (Open MPI) 4.1.2';; esac\nexit 0\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755))
	}
	return dir, filepath.Join(dir, "mpirun"), filepath.Join(dir, "ssh")
}

// TestBadHostfileRunsNothing: a hostfile with a line that ssh would read as an option, or that is not a
// hostfile at all, is refused by Run, Command and Check before anything runs: neither mpirun (not even
// mpirun --version) nor the launch agent's probe.
func TestBadHostfileRunsNothing(t *testing.T) {
	tests := []struct {
		name, text, wantErr string
	}{
		{"ProxyCommand", "node1 slots=1\n-oProxyCommand=/tmp/evil.sh slots=1\n",
			`, line 2: "-oProxyCommand=/tmp/evil.sh" is not a host name`},
		{"binary", "\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\n", ", line 1: not text"},
		{"garbage", "Lorem ipsum dolor sit amet\nconsectetur adipiscing elit\n", `, line 1: "ipsum" after host Lorem is not KEY=VALUE`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, entry := range []string{"Run", "Command", "Check"} {
				dir, mpirun, ssh := fakeLauncher(t)
				hostfile := filepath.Join(dir, "hosts")
				require.NoError(t, os.WriteFile(hostfile, []byte(tt.text), 0o644))
				var out bytes.Buffer
				opts := []Option{WithMPIRun(mpirun), WithLaunchAgent(ssh), WithHostfile(hostfile),
					WithEnviron([]string{"PATH=" + os.Getenv("PATH")}), WithStdio(nil, &out, &out)}
				var err error
				switch entry {
				case "Run":
					_, err = Run(context.Background(), 2, "./train", nil, opts...)
				case "Command":
					_, err = Command(context.Background(), 2, "./train", nil, opts...)
				case "Check":
					_, err = Check(context.Background(), 2, "./train", nil, opts...)
				}
				require.Error(t, err, entry)
				assert.Contains(t, err.Error(), "launch: hostfile "+hostfile+tt.wantErr, entry)
				assert.NoFileExists(t, filepath.Join(dir, "mpirun.ran"), "%s ran mpirun", entry)
				assert.NoFileExists(t, filepath.Join(dir, "ssh.ran"), "%s ran the launch agent", entry)
			}
		})
	}
}

// TestProbeGivesSSHTheHostAfterDoubleDash: the probe runs `ssh -o BatchMode=yes -- HOST true` once per host
// of the hostfile, however many lines name it.
func TestProbeGivesSSHTheHostAfterDoubleDash(t *testing.T) {
	dir, mpirun, ssh := fakeLauncher(t)
	hostfile := filepath.Join(dir, "hosts")
	require.NoError(t, os.WriteFile(hostfile, []byte("node7.invalid slots=1\nnode7.invalid slots=1\nnode8.invalid:2\n"), 0o644))
	var out bytes.Buffer
	code, err := Run(context.Background(), 0, "./train", nil, WithMPIRun(mpirun), WithLaunchAgent(ssh),
		WithHostfile(hostfile), WithEnviron([]string{"PATH=" + os.Getenv("PATH")}), WithStdio(nil, &out, &out))
	require.NoError(t, err, out.String())
	require.Equal(t, 0, code, out.String())
	probes, err := os.ReadFile(filepath.Join(dir, "ssh.ran"))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"-o BatchMode=yes -- node7.invalid true", "-o BatchMode=yes -- node8.invalid true"},
		strings.Split(strings.TrimSpace(string(probes)), "\n"))
	ran, err := os.ReadFile(filepath.Join(dir, "mpirun.ran"))
	require.NoError(t, err)
	assert.Contains(t, string(ran), "--hostfile "+hostfile, "mpirun ran after the probes")
}
