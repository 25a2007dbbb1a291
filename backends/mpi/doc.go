// Package mpi is goaccel's collective engine for jobs of more than one process: it binds the MPI C API
// (MPI-3 non-blocking collectives) through cgo and registers itself with backends.RegisterEngine as "mpi".
//
// The binding is compiled only with the `mpi` build tag, because it needs an MPI library and its headers:
//
//	go build -tags mpi ./...              # Open MPI, found with pkg-config ompi-c (apt-get install libopenmpi-dev)
//	go build -tags 'mpi mpich' ./...      # MPICH, found with pkg-config mpich
//
// Without the tag the package still compiles (so that it can always be imported) but registers nothing,
// and [LibraryVersion] returns "". A program launched with more than one rank but built without the tag
// fails when it opens the engine, with a message saying to rebuild with -tags mpi.
//
// Import it for its side effect, next to the code that opens the engine:
//
//	import _ "github.com/goaccel/goaccel/backends/mpi"
//
//	topo, err := backends.DetectTopology()
//	comm, err := backends.Open("mpi", topo)
//
// # How the engine uses MPI
//
// MPI is initialised once per process with MPI_Init_thread (MPI_THREAD_SERIALIZED: every call into MPI
// from this package holds one mutex, so no two threads are ever inside MPI at once) and finalised when the
// last engine is closed; MPI cannot be initialised again afterwards. If something else in the process
// initialised MPI first, the engine uses it and leaves finalisation to its owner.
//
// Each engine works on its own duplicates of MPI_COMM_WORLD (one for collectives, one for notices, one for
// the reduce-scatter's ring), whose error handler is MPI_ERRORS_RETURN, so an MPI failure comes back as an
// *[Error] carrying MPI_Error_string's text instead of killing the job from inside the library. Every collective is non-blocking (MPI_Iallreduce in place with MPI_SUM,
// MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier) and completes through MPI_Test, which is what lets
// backends.Communicator bound each wait with its watchdog. Buffers are Go memory that MPI keeps using after
// the call returns, so they are pinned with runtime.Pinner until MPI_Test reports completion.
//
// The reduce-scatter is the exception: the engine runs it itself, as a ring of MPI_Isend and MPI_Irecv on
// a communicator of its own. Open MPI's MPI_Ireduce_scatter_block reduces the whole buffer on rank 0 and
// mallocs two copies of it on every rank; the ring sends (N-1)/N of the buffer from each rank and holds at
// most two 4 MiB pieces of partial sums per reduce-scatter in flight. Every poll of any request advances
// every ring in flight, as MPI advances its own collectives in any call, so ranks may wait for their
// requests in different orders (docs/notes.md, Note [Reduce-scatter as a ring]).
//
// Sums of uint8 buffers use a user-defined MPI operation rather than MPI_SUM: Open MPI 4.1's AVX reduction
// kernels add 8-bit integers with saturating instructions, so a long enough MPI_UINT8_T sum comes back as
// 255 where C, Go and goaccel's other engines wrap modulo 256 (open-mpi/ompi#8045). goaccel's conformance
// check (backends/enginetest) found this on the first run.
//
// bfloat16 and fp16 buffers (compressed gradients) travel as MPI_UINT16_T, and their sums are user-defined
// operations too: each pair of values is converted to float32, added there, and the sum rounded back to
// the 16-bit format (to nearest, ties to even), so a reduction over N ranks rounds N-1 times. The C
// conversions follow package internal/half, which the in-process engine uses; TestHalfSumsMatchGo compares
// them bit for bit.
//
// Abort calls MPI_Abort on MPI_COMM_WORLD, which makes the launcher end every rank of the job.
//
// # Launching
//
// Start the program with mpirun (or srun); see the launch package, the `accel launch` command and
// docs/launching.md, which also describe the Open MPI settings goaccel's launcher adds in containers.
package mpi
