// Command accelbench measures goaccel against plain MPI, GoMLX's own trainer and PyTorch DDP, side by side
// in one run, and writes docs/benchmarks.md. `make bench` runs it from the repository root:
//
//	go build -tags mpi,blas -o bin/accelbench ./bench/cmd/accelbench
//	bin/accelbench -out docs/benchmarks.md -json bin/bench.json > bin/bench.txt
//	benchstat bin/bench.txt                                         # the raw samples
//	bin/accelbench -render bin/bench.json -out docs/benchmarks.md   # re-render, no measuring
//
// -quick measures everything once with tiny sizes (a smoke test; its numbers mean nothing), and -only
// picks sections (mpi, overhead, compute, e2e, transformer, purego, demo, network). The end-to-end and
// network sections run bin/grad_accum (built with -tags mpi) and PyTorch from /usr/bin/python3; the network
// section builds emulated clusters of hosts, which needs root. -hosts NAME[:SLOTS],... (with -launch-agent
// and -net, as `accel launch` takes them) runs the MPI and network sections across real hosts instead; see
// -h and docs/benchmarks-method.md.
package main

import (
	"os"

	"github.com/goaccel/goaccel/internal/bench"
)

func main() {
	os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr))
}
