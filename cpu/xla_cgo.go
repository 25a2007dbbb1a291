//go:build cgo

package cpu

import "github.com/gomlx/gomlx/backends/xla"

// GoMLX's XLA backend loads PJRT plugins through cgo: it is linked only where cgo is on. Without cgo (a
// cross-compiled binary, CGO_ENABLED=0), xla_nocgo.go stands in and the pure-Go backend is the only one.

// noAutoInstallEnv is the variable that stops GoMLX downloading PJRT plugins at run time.
const noAutoInstallEnv = xla.NoAutoInstallEnv

// installedPlugins lists the PJRT plugins installed on this machine.
func installedPlugins() []string { return xla.GetAvailablePlugins() }

// enablePluginDownloads lets GoMLX download PJRT plugins when a backend asks for one, or not.
func enablePluginDownloads(allow bool) { xla.EnableAutoInstall(allow) }
