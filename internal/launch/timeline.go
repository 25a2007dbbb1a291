package launch

import (
	"path/filepath"
	"slices"

	"github.com/goaccel/goaccel/internal/jobenv"
)

// WithTimeline has every process of the job record its timeline, which the main process writes to path
// when the job closes (jobenv.Timeline, read by accel.WithTimeline's environment variable). A relative path
// is made absolute against the launcher's directory, where the user looks for it, whatever directory the
// processes run in. "" leaves the environment as it is.
func WithTimeline(path string) Option {
	return func(c *config) {
		if abs, err := filepath.Abs(path); err == nil && path != "" {
			path = abs
		}
		c.timeline = path
	}
}

// addTimeline puts the timeline's variable into the job's environment, before the variables to forward
// are chosen: processes on other hosts get it too.
func (c *config) addTimeline() {
	if c.timeline != "" {
		c.environ = append(slices.Clone(c.environ), jobenv.Timeline+"="+c.timeline)
	}
}
