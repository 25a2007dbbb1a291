package prepare

// SetFreshAccumulators turns the fresh-accumulator micro-steps on or off (see Model.execs), for a test that
// compares the two, and returns what restores the setting.
func SetFreshAccumulators(on bool) (restore func()) {
	was := freshAccumulators
	freshAccumulators = on
	return func() { freshAccumulators = was }
}
