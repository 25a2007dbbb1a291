# goaccel: `make demo` trains the example on one CPU, `make test` runs every test (real MPI included).
# Both install what they need first (OpenMPI, the Fashion-MNIST Debian package).

GO ?= go
# The pure-Go GoMLX backend is the default; never let GoMLX download plugins during a build or test.
export GOMLX_NO_AUTO_INSTALL := 1
DEMO_ARGS ?=

.PHONY: all demo demo-mpi test vet build bench deps deps-openmpi deps-dataset clean

all: build

deps: deps-openmpi deps-dataset
deps-openmpi:
	@bash scripts/install-deps.sh openmpi
deps-dataset:
	@bash scripts/install-deps.sh dataset

build: deps-openmpi
	mkdir -p bin
	$(GO) build -o bin/accel ./cmd/accel
	$(GO) build -tags mpi -o bin/grad_accum ./examples/grad_accum

# The demo on one CPU.
demo: deps-dataset
	$(GO) run ./examples/grad_accum $(DEMO_ARGS)

# The same demo on 2 processes (same global batch: half the per-rank batch).
demo-mpi: build deps-dataset
	bin/accel launch -n 2 -- bin/grad_accum -batch 32 $(DEMO_ARGS)

vet: deps-openmpi
	test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags mpi ./...

# Every test, including the ones that start mpirun -np 2 and -np 4 (they build mpi-tagged binaries).
test: deps vet
	$(GO) test -count=1 -timeout 45m ./...

# Measures goaccel against plain MPI_Allreduce and GoMLX's trainer, side by side, and writes
# docs/benchmarks.md (a few minutes on 2 cores). Raw samples in benchstat format: bin/bench.txt; results:
# bin/bench.json (`bin/accelbench -render bin/bench.json` re-renders the page). A redirect, not a pipe, so
# make fails when the bench does.
bench: deps-openmpi
	mkdir -p bin
	$(GO) build -tags mpi -o bin/accelbench ./bench/cmd/accelbench
	bin/accelbench -out docs/benchmarks.md -json bin/bench.json > bin/bench.txt

clean:
	rm -rf bin
