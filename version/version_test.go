package version

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFromBuildInfo: a dependency reports the module version Go recorded, a checkout build the release and
// its commit, anything else the release.
func TestFromBuildInfo(t *testing.T) {
	tests := []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"dependency at a release", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: modulePath, Version: "v0.3.0"}}}, "v0.3.0"},
		{"dependency between releases", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: modulePath, Version: "v0.3.1-0.20261124221000-abcdef123456"}}},
			"v0.3.1-0.20261124221000-abcdef123456"},
		{"checkout build", debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}}},
			Release + " (commit 0123456789ab)"},
		{"checkout build with changes", debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}},
			Release + " (commit 0123456789ab, modified)"},
		{"test binary, no VCS stamp", debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "(devel)"}}, Release},
		// A user's module with `replace github.com/goaccel/goaccel => ../goaccel` reported "v0.0.0", and
		// the user's own commit stood for goaccel's.
		{"dependency replaced by a local copy", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: modulePath, Version: "v0.0.0",
				Replace: &debug.Module{Path: "../goaccel"}}},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "fedcba9876543210fedc"}}},
			Release + " (local copy ../goaccel)"},
		{"dependency replaced by another version", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: modulePath, Version: "v0.0.0",
				Replace: &debug.Module{Path: "example.com/fork/goaccel", Version: "v0.4.1-fork"}}}},
			"v0.4.1-fork"},
		{"another module's test binary (no dependencies listed)", debug.BuildInfo{
			Main:     debug.Module{Path: "example.com/app", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "fedcba9876543210fedc"}}}, Release},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, fromBuildInfo(&tc.info))
		})
	}
	assert.NotContains(t, String(), "(devel)")
}

// TestChangelogMatchesRelease: CHANGELOG.md's newest release is Release, and every change or removal it
// lists says how to migrate, so the version the code reports and the notes users read stay together.
func TestChangelogMatchesRelease(t *testing.T) {
	data, err := os.ReadFile("../CHANGELOG.md")
	require.NoError(t, err)
	releases := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindAllStringSubmatch(string(data), -1)
	require.NotEmpty(t, releases, "no release sections")
	assert.Equal(t, Release, releases[0][1], "the newest release in CHANGELOG.md")
	// The link references: [Unreleased] compares the newest release, and every release has its link.
	assert.Contains(t, string(data), "[Unreleased]: https://github.com/goaccel/goaccel/compare/v"+Release+"...HEAD")
	for _, r := range releases {
		assert.Regexp(t, `(?m)^\[`+regexp.QuoteMeta(r[1])+`\]: https://`, string(data), "release %s has no link", r[1])
	}

	section := ""
	var bullet strings.Builder
	check := func() {
		if bullet.Len() > 0 && (section == "Changed" || section == "Removed") {
			assert.Contains(t, bullet.String(), "**Migration:**", "a %s entry without a migration note:\n%s", section, bullet.String())
		}
		bullet.Reset()
	}
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "### "):
			check()
			section = strings.TrimPrefix(line, "### ")
		case strings.HasPrefix(line, "## "):
			check()
			section = ""
		case strings.HasPrefix(line, "- "):
			check()
			bullet.WriteString(line)
		case strings.HasPrefix(line, "  ") && bullet.Len() > 0:
			bullet.WriteString(" " + strings.TrimSpace(line))
		default:
			check()
		}
	}
	check()
}
