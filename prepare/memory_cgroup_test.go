package prepare

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
)

const gib = 1 << 30

// fakeRoot lays out files under a temporary root: path → content.
func fakeRoot(t *testing.T, files map[string]string) string {
	root := t.TempDir()
	for path, content := range files {
		full := filepath.Join(root, path)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(content), 0o644))
	}
	return root
}

// TestAvailableMemory: the memory check compares a process's need with the machine's available memory, the
// limits of the cgroups the process runs in (v1 and v2, its own or an ancestor's), and its share among the
// job's processes on the machine. Before, two ranks on one host each compared against the whole machine
// and both started, and a cgroup limit below the process's own cgroup was never read.
func TestAvailableMemory(t *testing.T) {
	meminfo := "MemTotal:       24000000 kB\nMemAvailable:   20971520 kB\n" // 20 GiB available
	for _, tc := range []struct {
		name    string
		files   map[string]string
		sharing int
		want    uint64
		wantOK  bool
	}{
		{"the machine alone", map[string]string{"proc/meminfo": meminfo, "proc/self/cgroup": "0::/\n"}, 1, 20 * gib, true},
		{"two processes share it", map[string]string{"proc/meminfo": meminfo}, 2, 10 * gib, true},
		{"cgroup v2 limit on the process's scope", map[string]string{
			"proc/meminfo":                                        meminfo,
			"proc/self/cgroup":                                    "0::/user.slice/run-1.scope\n",
			"sys/fs/cgroup/user.slice/memory.max":                 "max\n",
			"sys/fs/cgroup/user.slice/run-1.scope/memory.max":     "2147483648\n",
			"sys/fs/cgroup/user.slice/run-1.scope/memory.current": "536870912\n",
		}, 1, 3 * gib / 2, true},
		{"cgroup v2 limit on an ancestor", map[string]string{
			"proc/meminfo":                      meminfo,
			"proc/self/cgroup":                  "0::/jobs/a/b\n",
			"sys/fs/cgroup/jobs/memory.max":     "4294967296\n",
			"sys/fs/cgroup/jobs/memory.current": "0\n",
			"sys/fs/cgroup/jobs/a/b/memory.max": "max\n",
		}, 2, 2 * gib, true},
		{"cgroup v1 without a limit", map[string]string{
			"proc/meminfo":     meminfo,
			"proc/self/cgroup": "4:memory:/process_api/x\n3:cpuset:/\n",
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":               "9223372036854771712\n",
		}, 1, 20 * gib, true},
		{"cgroup v1 limit", map[string]string{
			"proc/meminfo":     meminfo,
			"proc/self/cgroup": "11:cpu,memory:/docker/abc\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "2147483648\n",
			"sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": "1073741824\n",
		}, 1, 1 * gib, true},
		{"inside a cgroup namespace (the mount is the process's cgroup)", map[string]string{
			"proc/meminfo":                 meminfo,
			"proc/self/cgroup":             "0::/not/below/the/mount\n",
			"sys/fs/cgroup/memory.max":     "3221225472\n",
			"sys/fs/cgroup/memory.current": "1073741824\n",
		}, 1, 2 * gib, true},
		{"nothing known", map[string]string{}, 1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := availableMemory(fakeRoot(t, tc.files), tc.sharing)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestProcessesSharingMemory: goroutine ranks of one process all draw on its memory.
func TestProcessesSharingMemory(t *testing.T) {
	comms, err := backends.NewInProcessGroup(3)
	require.NoError(t, err)
	assert.Equal(t, 3, processesSharingMemory(comms[0]))
	t.Setenv("OMPI_COMM_WORLD_SIZE", "4")
	t.Setenv("OMPI_COMM_WORLD_RANK", "1")
	t.Setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
	t.Setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
	assert.Equal(t, 2, processesSharingMemory(backends.NewSingle()), "two of the job's four processes on this machine")
}
