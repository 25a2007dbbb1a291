// Package jobenv names the environment variables through which goaccel's launcher speaks to the processes
// it starts. Both sides import it — the launcher sets them, package accel reads them — so neither imports
// the other.
package jobenv

// RestartCount is set in the environment of every process of a job that the launcher may restart: the
// number of times the job was restarted so far, 0 on the first run, as torchrun's
// TORCHELASTIC_RESTART_COUNT. goaccel programs read it as accel.Accelerator.RestartCount.
const RestartCount = "GOACCEL_RESTART_COUNT"
