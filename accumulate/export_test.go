package accumulate

// The gradient state's bookkeeping of micro-batches is driven by the Reducer alone; the tests of the state
// machine drive it directly through these.

func (s *GradientState) InAccumulate() bool             { return s.inAccumulate }
func (s *GradientState) ReduceThisStep() bool           { return s.reduceThisStep() }
func (s *GradientState) RecordMicroBatch(scale float64) { s.recordMicroBatch(scale) }
func (s *GradientState) SyncCorrection() float64        { return s.syncCorrection() }
