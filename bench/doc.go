// Package bench measures goaccel side by side with the baselines users compare it to, in one run, and
// renders docs/benchmarks.md. `make bench` runs it through the accelbench command (bench/cmd/accelbench).
//
// What is measured (issue 5), each with a goal the report checks:
//
//  1. All-reduce efficiency: Communicator.AllReduceSum against a plain C loop of MPI_Allreduce on the same
//     buffers in the same processes (MeasureAllReduce), 64 KB to 64 MB, 2 and 4 ranks, with diagnostic
//     variants that separate MPI's algorithm, the Go side of polling and the Communicator's back-off.
//  2. Bucketing: the gradient sync of a 102-tensor, 22 MB model, bucketed at several caps, against one
//     all-reduce per tensor and one flat all-reduce (MeasureSync).
//  3. Accumulation: real GoMLX training steps with Accumulate (K=4) against syncing every micro-batch
//     (MeasureAccumulation).
//  4. Overhead: goaccel's loop against GoMLX's train.Trainer with AccumulateGradients, one process
//     (MeasureOverhead).
//  5. Overlap: the Reducer's pipelined bucket all-reduces against the same buckets reduced one after
//     another (part of MeasureSync).
//
// How: a Driver starts the accelbench binary under mpirun, through goaccel's launch package, once per
// world size; each rank runs RunRankJob and rank 0 writes its results to a file the driver reads. The
// single-process overhead measurement runs in the driver. Every comparison goes through Group.Measure,
// which interleaves the variants' samples so that a shared machine's slow phases hit them alike, and
// takes each multi-rank sample as the slowest rank's time. On request (-what-if) a second set of mpirun
// jobs measures changes to goaccel before anyone makes them (fixes.go). Results are benchstat lines on
// standard output, a JSON file on request, and the Markdown report (Report).
//
// The plain-MPI reference is compiled with the `mpi` build tag, like goaccel's engine; without it
// OpenRawMPI fails and only the in-process testing.B benchmarks of this package run.
package bench
