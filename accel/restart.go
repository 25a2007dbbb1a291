package accel

// RestartCount is the number of times a launcher restarted this job after a process failed: 0 on the
// first run. `accel launch --max-restarts N` sets it through GOACCEL_RESTART_COUNT (torchrun's
// TORCHELASTIC_RESTART_COUNT), which New reads with the other variables (see OptionsFromEnv). A program
// can say that it is resuming after a failure, or keep the count in its logs.
func (a *Accelerator) RestartCount() int { return a.cfg.restartCount }
