//go:build !cgo

package cpu

// Without cgo, GoMLX's XLA backend is not linked (its PJRT plugins load through cgo): there are no plugins
// to find or download, and asking for "xla" fails at New, naming the backend.

// noAutoInstallEnv is GoMLX's variable that stops plugin downloads, set for any code that links XLA itself.
const noAutoInstallEnv = "GOMLX_NO_AUTO_INSTALL"

func installedPlugins() []string { return nil }

func enablePluginDownloads(bool) {}
