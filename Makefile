# goaccel: `make demo` trains the example on one CPU, `make test` runs every test (real MPI included).
# Both install what they need first (OpenMPI, OpenBLAS, the Fashion-MNIST Debian package; PyTorch for the tests).

GO ?= go
# The pure-Go GoMLX backend is the default; never let GoMLX download plugins during a build or test.
export GOMLX_NO_AUTO_INSTALL := 1
# `blas` routes the pure-Go backend's matrix multiplications to OpenBLAS; `mpi` links the MPI engine.
TAGS ?= blas
MPI_TAGS ?= mpi,$(TAGS)
DEMO_ARGS ?=

.PHONY: all demo demo-mpi test test-fast test-slow test-race test-portability vet build bench deps deps-openmpi deps-dataset deps-openblas deps-torch deps-iproute2 clean

all: build

deps: deps-openmpi deps-dataset deps-openblas
deps-openmpi:
	@bash scripts/install-deps.sh openmpi
deps-dataset:
	@bash scripts/install-deps.sh dataset
deps-openblas:
	@bash scripts/install-deps.sh openblas
deps-torch:
	@bash scripts/install-deps.sh torch
deps-iproute2:
	@bash scripts/install-deps.sh iproute2

# Both binaries link MPI, so `bin/accel env` reports the MPI library the jobs will use.
build: deps-openmpi deps-openblas
	mkdir -p bin
	$(GO) build -tags $(MPI_TAGS) -o bin/accel ./cmd/accel
	$(GO) build -tags $(MPI_TAGS) -o bin/grad_accum ./examples/grad_accum

# The demo on one CPU: the MLP by default, DEMO_ARGS="-model cnn" for the CNN.
demo: deps-dataset deps-openblas
	$(GO) run -tags $(TAGS) ./examples/grad_accum $(DEMO_ARGS)

# The same demo on 2 processes (same global batch: half the per-rank batch).
demo-mpi: build deps-dataset
	bin/accel launch -n 2 -- bin/grad_accum -batch 32 $(DEMO_ARGS)

vet: deps-openmpi deps-openblas
	test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags $(MPI_TAGS) ./...

# Every test, in two tiers. The fast tier (`make test-fast`, about a minute) is every package's tests with
# -short: no real mpirun job, no emulated cluster, no PyTorch. The slow tier (`make test-slow`) is the whole
# suite: the mpirun -np 2 and -np 4 jobs (they build mpi-tagged binaries), the tests across an emulated
# cluster of hosts (network namespaces: root and iproute2, hence deps-iproute2) and the bench's quick
# end-to-end run against PyTorch (hence deps-torch), with the BLAS path. Then the CPU kernels again without
# BLAS, so the pure-Go path stays tested; the race detector over the collectives, the gradient path and the
# facade, MPI ranks included (mpirun starts the race-built binaries); and the portability checks (the kernel
# tests at GOAMD64=v3, arm64 and purego builds). CI runs all of it.
test: deps deps-torch deps-iproute2 vet test-fast test-slow test-race test-portability

test-fast: deps-openblas
	$(GO) test -short -count=1 -timeout 10m -tags $(TAGS) ./...

test-slow: deps deps-torch deps-iproute2
	$(GO) test -count=1 -timeout 45m -tags $(TAGS) ./...
	$(GO) test -count=1 -timeout 10m ./cpu/...

test-race: deps-openmpi deps-openblas
	$(GO) test -count=1 -timeout 30m -race -tags $(MPI_TAGS) ./backends/ ./backends/enginetest/ ./backends/mpi/ \
		./accumulate/ ./prepare/ ./accel/

test-portability:
	bash scripts/check-portability.sh

# Measures goaccel against plain MPI_Allreduce, GoMLX's trainer and PyTorch (DDP), side by side, and writes
# docs/benchmarks.md: about twenty minutes on 2 cores once the demo's CNN meets its goals (its five-epoch
# wall time is one of the measurements: every minute it takes over 90 s adds to the run). Section 6 builds
# emulated clusters of hosts (network namespaces): run as root, or the page says it was not measured. Raw samples in
# benchstat format: bin/bench.txt; results: bin/bench.json (`bin/accelbench -render bin/bench.json`
# re-renders the page). A redirect, not a pipe, so make fails when the bench does. grad_accum_purego is the
# demo without the blas tag, for the pure-Go CNN rows; grad_accum_purego_0.2.0 the same demo of release
# 0.2.0, the pure-Go goal's baseline, built from that release's commit (PUREGO_BASELINE).
bench: build deps-dataset deps-torch bin/grad_accum_purego_0.2.0
	$(GO) build -tags $(MPI_TAGS) -o bin/accelbench ./internal/bench/cmd/accelbench
	$(GO) build -tags $(MPI_TAGS) -o bin/charlm ./examples/charlm
	$(GO) build -tags mpi -o bin/grad_accum_purego ./examples/grad_accum
	$(GO) build -tags $(MPI_TAGS) -o bin/resnet ./examples/resnet
	$(GO) build -tags mpi -o bin/resnet_purego ./examples/resnet
	$(GO) build -tags $(MPI_TAGS) -o bin/lstm ./examples/lstm
	bin/accelbench -out docs/benchmarks.md -json bin/bench.json > bin/bench.txt

# Release 0.2.0 is this commit (the release before the convolution and element-wise kernels).
PUREGO_BASELINE ?= 2a3ed10
bin/grad_accum_purego_0.2.0:
	rm -rf bin/src-0.2.0 && mkdir -p bin/src-0.2.0
	git archive $(PUREGO_BASELINE) | tar -x -C bin/src-0.2.0
	cd bin/src-0.2.0 && $(GO) build -tags mpi -o ../grad_accum_purego_0.2.0 ./examples/grad_accum
	rm -rf bin/src-0.2.0

clean:
	rm -rf bin
