package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
)

// TestLaunchRefusesBadHostfile: `accel launch --hostfile FILE` with a line that ssh would read as an
// option, or with a file that is no hostfile, fails naming the file and line, and runs nothing: neither
// mpirun nor the launch agent (both stand-ins here record that they ran).
func TestLaunchRefusesBadHostfile(t *testing.T) {
	tests := []struct {
		name, text, wantStderr string
	}{
		{"ProxyCommand", "node1 slots=1\n-oProxyCommand=/tmp/evil.sh slots=1\n",
			`, line 2: "-oProxyCommand=/tmp/evil.sh" is not a host name: it starts with '-'`},
		{"binary", "\x00\x01\x02\x03garbage\n", ", line 1: not text ('\\x00' at byte 1)"},
		{"empty", "", " names no host"},
		{"comments only", "# node1 slots=4\n\n", " names no host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			marker := filepath.Join(dir, "ran")
			for _, name := range []string{"mpirun", "ssh"} {
				script := "#!/bin/sh\necho \"" + name + " $*\" >> '" + marker + "'\n" +
					"case \"$1\" in --version) echo 'mpirun (Open MPI) 4.1.2';; esac\nexit 0\n"
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755))
			}
			hostfile := filepath.Join(dir, "hosts")
			require.NoError(t, os.WriteFile(hostfile, []byte(tt.text), 0o644))
			a, stdout, stderr := newTestApp(launch.WithEnviron([]string{"PATH=" + os.Getenv("PATH")}))
			code := a.run([]string{"launch", "--mpirun", filepath.Join(dir, "mpirun"), "--launch-agent",
				filepath.Join(dir, "ssh"), "--hostfile", hostfile, "--", "./train"})
			assert.Equal(t, 1, code, "stdout: %s\nstderr: %s", stdout, stderr)
			assert.Contains(t, stderr.String(), "accel launch: hostfile "+hostfile+tt.wantStderr)
			assert.NoFileExists(t, marker, "mpirun or the launch agent ran")
		})
	}
}
