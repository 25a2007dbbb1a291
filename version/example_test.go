package version_test

import (
	"fmt"
	"strings"

	"github.com/goaccel/goaccel/version"
)

// String starts with the release (or, for goaccel as a dependency, the module version).
func ExampleString() {
	fmt.Println(strings.HasPrefix(version.String(), version.Release) || strings.HasPrefix(version.String(), "v"))
	// Output: true
}
