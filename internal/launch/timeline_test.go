package launch

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/jobenv"
)

// TestTimelineEnvironment: the job's environment names the timeline's absolute path (ExampleWithTimeline
// shows it forwarded to other hosts) and leaves the caller's environment slice alone; no path, no variable.
func TestTimelineEnvironment(t *testing.T) {
	wd, err := os.Getwd()
	require.NoError(t, err)
	for _, tc := range []struct {
		name, path, want string
	}{
		{"relative", "runs/job.json", filepath.Join(wd, "runs/job.json")},
		{"absolute", "/data/job.json", "/data/job.json"},
		{"none", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			environ := []string{"HOME=/home/me"}
			c := newConfig([]Option{WithEnviron(environ), WithTimeline(tc.path)})
			assert.Equal(t, []string{"HOME=/home/me"}, environ, "the caller's slice is not written")
			v, ok := c.lookupEnv(jobenv.Timeline)
			assert.Equal(t, tc.want != "", ok)
			assert.Equal(t, tc.want, v)
		})
	}
}
