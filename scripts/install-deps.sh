#!/usr/bin/env bash
# Installs what goaccel's tests and demo need on a Debian/Ubuntu machine, skipping what is already there:
#   openmpi  - OpenMPI (mpirun and the headers the mpi build tag compiles against) and pkg-config
#   dataset  - Fashion-MNIST in /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist)
#   openblas - OpenBLAS headers and library for the `blas` build tag (the fast CPU matmul path)
#   torch    - PyTorch (Debian python3-torch), the peer `make bench` measures goaccel against
#   iproute2 - ip and tc, with which the tests build emulated clusters of hosts (network namespaces on a
#              bridge, rate limits); unshare and nsenter come from util-linux, which Debian always has
# Usage: scripts/install-deps.sh [openmpi] [dataset] [openblas] [torch] [iproute2]   (no argument: the first three)
set -euo pipefail

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(openmpi dataset openblas)

packages=()
for w in "${want[@]}"; do
	case "$w" in
	openmpi)
		command -v mpirun >/dev/null 2>&1 && pkg-config --exists ompi-c 2>/dev/null ||
			packages+=(libopenmpi-dev openmpi-bin pkg-config)
		;;
	dataset)
		[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || packages+=(dataset-fashion-mnist)
		;;
	openblas)
		pkg-config --exists openblas 2>/dev/null || packages+=(libopenblas-dev pkg-config)
		;;
	torch)
		/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || packages+=(python3-torch)
		;;
	iproute2)
		PATH="$PATH:/usr/sbin:/sbin" command -v ip >/dev/null 2>&1 && PATH="$PATH:/usr/sbin:/sbin" command -v tc >/dev/null 2>&1 ||
			packages+=(iproute2)
		;;
	*)
		echo "install-deps: unknown component '$w' (want openmpi, dataset, openblas, torch or iproute2)" >&2
		exit 2
		;;
	esac
done

[ ${#packages[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		sudo="sudo"
	else
		echo "install-deps: need root (or sudo) to install: ${packages[*]}" >&2
		exit 1
	fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-deps: no apt-get; install these yourself: ${packages[*]}" >&2
	exit 1
fi
echo "install-deps: installing ${packages[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" </dev/null
