#!/usr/bin/env bash
# check-portability.sh: the checks that what ships compiles, and computes the same bits, beyond the
# default amd64 build of the machine at hand:
#
#   1. the kernel tests (internal/vec32, cpu/internal/...) built with GOAMD64=v3, where the compiler may
#      fuse multiply-adds in the Go loops that the assembly must match bit for bit;
#   2. GOARCH=arm64 go vet ./... and go build ./...: the whole repository on an architecture without the
#      amd64 assembly;
#   3. go vet and the kernel packages' tests with the purego tag: the Go fallbacks on amd64.
#
# Every step runs, even after one fails; the script exits non-zero when any did, naming them.
# Usage: scripts/check-portability.sh (from anywhere; GO selects the go command, default go).
set -u -o pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
failed=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# step NAME COMMAND...: runs COMMAND, its output shown and kept in $log, and records NAME when it fails.
step() {
	local name=$1
	shift
	echo "==> $name: $*"
	if ! "$@" 2>&1 | tee "$log"; then
		failed+=("$name")
		if grep -q 'undefined: pjrt\.' "$log"; then
			echo "    (go-xla's pjrt needs cgo, which go turns off when cross-compiling: CGO_ENABLED=0 without a" \
				"C compiler for the target)"
		fi
	fi
}

# A GOAMD64=v3 test binary runs only on a processor with the v3 instructions (AVX2, FMA, BMI1/2, ...).
amd64_v3=yes
if [ "$("$GO" env GOHOSTARCH)" = amd64 ] && [ -r /proc/cpuinfo ]; then
	for flag in avx2 fma bmi1 bmi2 f16c movbe abm; do
		if ! grep -qw "$flag" /proc/cpuinfo; then
			amd64_v3=no
		fi
	done
fi
if [ "$amd64_v3" = yes ]; then
	step "GOAMD64=v3 kernel tests" env GOAMD64=v3 "$GO" test -count=1 ./internal/vec32/... ./cpu/internal/...
else
	echo "==> GOAMD64=v3 kernel tests: skipped, this processor cannot run amd64 v3 binaries"
fi

step "arm64 vet" env GOARCH=arm64 "$GO" vet ./...
step "arm64 build" env GOARCH=arm64 "$GO" build ./...

step "purego vet" "$GO" vet -tags purego ./...
step "purego kernel tests" "$GO" test -count=1 -tags purego ./internal/vec32/... ./cpu/internal/gemmtile/

if [ ${#failed[@]} -gt 0 ]; then
	printf 'check-portability: FAILED:' >&2
	printf ' [%s]' "${failed[@]}" >&2
	printf '\n' >&2
	exit 1
fi
echo "check-portability: all checks passed"
