//go:build race

package cpu

// raceDetector is whether this binary was built with the race detector (-race): see scheduleOps.
const raceDetector = true
