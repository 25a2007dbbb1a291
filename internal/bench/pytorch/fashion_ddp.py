#!/usr/bin/env python3
"""Trains the grad_accum demo's job on Fashion-MNIST with PyTorch, as the reference accelbench compares
goaccel with: the same model, Adam learning rate, per-process batch, gradient accumulation and epochs.

Several processes train with DistributedDataParallel over gloo; accumulation skips the all-reduce of the
first k-1 micro-batches with no_sync() and scales each micro-batch's loss by 1/k, the usual DDP recipe. One
process trains the plain module: no DDP wrapper, nothing to synchronise.

On one machine, --procs N starts the N processes itself (torch.multiprocessing, gloo over the loopback
interface). On several hosts, start one process per host with --rank R --world N and the address of rank 0's
host (--master-addr, --master-port), and name the network gloo uses: --ifname (an interface) or --subnet (the
interface whose IPv4 address is in it). The script reads nothing else from its environment, so it can be
started through ssh or a launch agent, even from standard input (`python3 - ARGS < fashion_ddp.py`).

The last line on standard output is one JSON object with the fields the demo's summary line has
(train_seconds, examples_per_second, test_accuracy, ...). Training time excludes data loading and test
evaluation. No network access: the IDX files are read from --data with gzip and numpy.

    /usr/bin/python3 internal/bench/pytorch/fashion_ddp.py --procs 2 --model mlp --epochs 1
    /usr/bin/python3 internal/bench/pytorch/fashion_ddp.py --rank 1 --world 2 --master-addr 10.0.0.1 --ifname eth0
"""

import argparse
import datetime
import fcntl
import gzip
import ipaddress
import json
import os
import socket
import struct
import sys
import time

import numpy as np

# Fashion-MNIST's training-pixel statistics, as the demo standardises its inputs.
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=1,
                   help="processes on this machine, started by the script (DDP over gloo when more than 1)")
    p.add_argument("--rank", type=int, default=-1, help="with --world: this process's rank, the others started elsewhere")
    p.add_argument("--world", type=int, default=0, help="processes of a job started one by one (on several hosts)")
    p.add_argument("--master-addr", default="127.0.0.1", help="with --world: the address of rank 0's host")
    p.add_argument("--master-port", type=int, default=29500, help="with --world: the port rank 0 listens on")
    p.add_argument("--ifname", default="", help="with --world: the network interface gloo uses (GLOO_SOCKET_IFNAME)")
    p.add_argument("--subnet", default="", help="with --world: use the interface whose IPv4 address is in this subnet")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds a process waits for the others to join or answer before it fails")
    p.add_argument("--threads", type=int, default=0,
                   help="compute threads per process (0: the machine's cores divided by the processes on it)")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64, help="batch size per process")
    p.add_argument("--k", type=int, default=4, help="gradient accumulation steps")
    p.add_argument("--lr", type=float, default=0.002, help="Adam learning rate")
    p.add_argument("--hidden", type=int, default=128, help="units in the MLP's hidden layer")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--limit", type=int, default=0, help="use at most this many training examples (0: all)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--comm-hook", choices=["none", "bf16", "fp16", "powersgd", "postlocal"], default="none",
                   help="what DDP sends: every gradient (none), bf16_compress_hook (torch 1.13 takes it only with CUDA and "
                        "NCCL), fp16_compress_hook, powerSGD_hook, or post-local SGD "
                        "(post_localSGD_hook with PostLocalSGDOptimizer)")
    p.add_argument("--powersgd-rank", type=int, default=4, help="with --comm-hook powersgd: matrix_approximation_rank")
    p.add_argument("--powersgd-start", type=int, default=1000, help="with --comm-hook powersgd: start_powerSGD_iter")
    p.add_argument("--local-period", type=int, default=8,
                   help="with --comm-hook postlocal: optimizer steps between two averages of the parameters")
    args = p.parse_args(argv)
    if args.procs < 1 or args.batch < 1 or args.k < 1 or args.epochs < 1:
        p.error("--procs, --batch, --k and --epochs must be at least 1")
    local = args.procs
    if args.world > 0 or args.rank >= 0:
        if args.procs != 1:
            p.error("--procs starts processes on this machine; with --rank and --world they are started elsewhere")
        if not 0 <= args.rank < args.world:
            p.error(f"--rank {args.rank} is not a rank of --world {args.world}")
        if args.ifname and args.subnet:
            p.error("--ifname and --subnet both name gloo's network: give one")
        args.procs = args.world
    else:
        args.rank = -1
    if args.threads <= 0:
        args.threads = max(1, len(os.sched_getaffinity(0)) // local)
    if args.comm_hook == "postlocal" and args.k != 1:
        p.error("--comm-hook postlocal averages every --local-period optimizer steps; it takes --k 1")
    return args


def interface_in(subnet):
    """The name of this host's interface with an IPv4 address in subnet (SIOCGIFADDR on each interface)."""
    net = ipaddress.ip_network(subnet, strict=False)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                addr = ipaddress.ip_address(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
            except OSError:
                continue  # no IPv4 address
            if addr in net:
                return name
    raise SystemExit(f"fashion_ddp.py: no interface of this host has an address in {subnet}")


def limit_threads(threads):
    """Every thread pool torch may use, before torch is imported: torch.set_num_threads alone leaves the
    BLAS library's own pool at the machine's core count."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def read_idx(path):
    """An IDX file (gzip-compressed) as a numpy array: big-endian dimensions, then unsigned bytes."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split, limit=0):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    # Pixels scaled to [0, 1]; the models standardise them, as the demo's do.
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def build_model(torch, args):
    nn = torch.nn

    class Standardise(nn.Module):
        """[batch, 28, 28] pixels in [0, 1] → standardised [batch, 1, 28, 28]."""

        def forward(self, x):
            return ((x - PIXEL_MEAN) / PIXEL_STD).unsqueeze(1)

    if args.model == "mlp":
        return nn.Sequential(Standardise(), nn.Flatten(), nn.Linear(784, args.hidden), nn.ReLU(),
                             nn.Linear(args.hidden, 10))
    # The demo's CNN: two 3×3 "same" convolutions (16 and 32 channels), each followed by ReLU and 2×2 max
    # pooling, then a dense hidden layer and the logits.
    return nn.Sequential(
        Standardise(),
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))


def shard(n, epoch, rank, procs, seed):
    """This rank's examples for one epoch: a permutation the same on every rank, dealt round-robin and cut
    to equal lengths so that every rank runs the same number of micro-batches (and collectives)."""
    perm = np.random.default_rng(seed + epoch).permutation(n)
    per_rank = n // procs
    return perm[rank::procs][:per_rank]


def worker(rank, args, master, results):
    """One process of the job. master is (address, port, interface) of the process group."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    distributed = args.procs > 1
    if distributed:
        addr, port, ifname = master
        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
        dist.init_process_group("gloo", rank=rank, world_size=args.procs,
                                timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data, "train", args.limit)
    x_test, y_test = load(args.data, "test")
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)

    module = build_model(torch, args)
    model = torch.nn.parallel.DistributedDataParallel(module) if distributed else module
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sent = [0]  # bytes this process handed to all-reduces while training
    if distributed:
        opt = register_comm_hook(torch, dist, model, opt, args, sent)
    parameters = sum(p.numel() for p in module.parameters())
    # Shuffles are drawn before the clock starts: data loading is not what is compared.
    shards = [torch.from_numpy(shard(len(y_train), e, rank, args.procs, args.seed)) for e in range(args.epochs)]

    if distributed:
        dist.barrier()
    sent[0] = 0
    start = time.perf_counter()
    steps = 0
    for epoch in range(args.epochs):
        idx = shards[epoch]
        n_batches = (len(idx) + args.batch - 1) // args.batch
        loss_sum, batches = 0.0, 0
        for b in range(n_batches):
            sel = idx[b * args.batch:(b + 1) * args.batch]
            x, y = x_train[sel], y_train[sel]
            # The optimizer steps every k micro-batches and on the epoch's last one, on the mean gradient of
            # the cycle's micro-batches, as goaccel does.
            step = (b + 1) % args.k == 0 or b == n_batches - 1
            cycle = min(args.k, n_batches - (b - b % args.k))
            if step or not distributed:
                loss = F.cross_entropy(model(x), y)
                (loss / cycle).backward()
            else:
                with model.no_sync():
                    loss = F.cross_entropy(model(x), y)
                    (loss / cycle).backward()
            if step:
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps += 1
            loss_sum += loss.item()
            batches += 1
    if distributed:
        dist.barrier()
    train_seconds = time.perf_counter() - start
    if distributed and args.comm_hook == "none":
        # DDP's built-in all-reduce runs in C++, out of the count's reach: it sends every gradient at every step.
        sent[0] = steps * sum(p.numel() * p.element_size() for p in module.parameters())
    collective_bytes = sent[0]

    correct = 0
    if rank == 0:
        module.eval()
        with torch.no_grad():
            xt, yt = torch.from_numpy(x_test), torch.from_numpy(y_test)
            for i in range(0, len(yt), 1000):
                correct += (module(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
    if distributed:
        # Every rank's wall time: the job is done when the slowest rank is.
        t = torch.tensor([train_seconds, loss_sum, batches], dtype=torch.float64)
        times = [torch.zeros_like(t) for _ in range(args.procs)]
        dist.all_gather(times, t)
        train_seconds = max(float(x[0]) for x in times)
        loss_sum, batches = sum(float(x[1]) for x in times), sum(int(x[2]) for x in times)
        dist.destroy_process_group()
    if rank != 0:
        return
    examples = len(y_train) * args.epochs
    summary = dict(impl="pytorch", torch=torch.__version__, model=args.model, parameters=parameters,
                   world_size=args.procs, threads_per_process=args.threads, epochs=args.epochs,
                   batch_size=args.batch, accumulation_steps=args.k, optimizer_steps=steps,
                   train_examples=len(y_train),
                   train_seconds=round(train_seconds, 6), examples_per_second=examples / train_seconds,
                   test_accuracy=correct / len(y_test), final_loss=loss_sum / max(batches, 1),
                   comm_hook=args.comm_hook, collective_bytes=collective_bytes)
    if results is not None:
        results.put(summary)
    else:
        print(json.dumps(summary), flush=True)


def register_comm_hook(torch, dist, model, opt, args, sent):
    """Registers --comm-hook on the DDP model and returns the optimizer to step (post-local SGD wraps it).
    Every all-reduce the hooks and the model averager start goes through dist.all_reduce, which is wrapped to
    count the bytes handed to it: the counterpart of goaccel's collective_bytes."""
    plain = dist.all_reduce

    def counted(tensor, *a, **kw):
        sent[0] += tensor.numel() * tensor.element_size()
        return plain(tensor, *a, **kw)

    dist.all_reduce = counted
    if args.comm_hook == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.comm_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                       start_powerSGD_iter=args.powersgd_start)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    elif args.comm_hook == "postlocal":
        # Local from the first step, as goaccel's local SGD: no gradient travels (post_local_gradient_allreduce
        # off, and no warm-up), and the optimizer averages the parameters every --local-period steps.
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as postlocal
        from torch.distributed.algorithms.model_averaging import averagers
        from torch.distributed.optim import PostLocalSGDOptimizer
        state = postlocal.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=0,
                                            post_local_gradient_allreduce=False)
        model.register_comm_hook(state, postlocal.post_localSGD_hook)
        return PostLocalSGDOptimizer(optim=opt, averager=averagers.PeriodicModelAverager(
            period=args.local_period, warmup_steps=0))
    return opt


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    args = parse_args(argv)
    limit_threads(args.threads)
    if args.rank >= 0:
        ifname = interface_in(args.subnet) if args.subnet else args.ifname
        worker(args.rank, args, (args.master_addr, args.master_port, ifname), None)
        return 0
    if args.procs == 1:
        worker(0, args, None, None)
        return 0
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(worker, args=(args, ("127.0.0.1", free_port(), "lo"), results), nprocs=args.procs, join=True,
                       start_method="spawn")
    print(json.dumps(results.get()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
