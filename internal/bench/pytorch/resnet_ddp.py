#!/usr/bin/env python3
"""Trains examples/resnet's job on Fashion-MNIST with PyTorch, as the reference accelbench compares goaccel
with: the same small ResNet, initialisation, Adam settings, per-process batch, gradient accumulation, dropout
and epochs.

The model (examples/resnet/model.go): a 3×3 convolution stem with batch normalization, ReLU and 2×2 max
pooling (28×28 → 14×14); a stage of basic blocks at the stem's width; a stage at twice the width whose
first block has stride 2 and a 1×1 strided projection shortcut (→ 7×7); global average pooling, dropout and
a dense layer to 10 logits. Convolutions have no bias and He-normal weights (fan in), the dense layer
Xavier-uniform weights and zero biases; batch normalization has PyTorch's defaults (momentum 0.1, ε = 1e-5),
which goaccel's side sets explicitly. Adam with ε = 1e-8 on both sides.

Several processes train with DistributedDataParallel over gloo on the loopback interface, started by
torch.multiprocessing; accumulation skips the all-reduce of the first k-1 micro-batches with no_sync() and
scales each micro-batch's loss by the cycle's length, the usual DDP recipe. DDP's defaults stand: batch
normalization computes each process's own batch statistics, and rank 0's running averages are broadcast at
every forward pass. One process trains the plain module: no DDP wrapper, nothing to synchronise.

The last line on standard output is one JSON object with the fields examples/resnet's summary has
(train_seconds, examples_per_second, test_accuracy, parameters, ...). Training time excludes data loading
and test evaluation. No network access: the IDX files are read from --data with gzip and numpy.

    /usr/bin/python3 internal/bench/pytorch/resnet_ddp.py --procs 2 --epochs 1
"""

import argparse
import datetime
import gzip
import json
import os
import socket
import sys
import time

import numpy as np

# Fashion-MNIST's training-pixel statistics, as the model standardises its inputs.
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530
# Batch normalization and Adam as examples/resnet sets them.
BN_MOMENTUM, BN_EPSILON, ADAM_EPSILON = 0.1, 1e-5, 1e-8


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=1,
                   help="processes on this machine, started by the script (DDP over gloo when more than 1)")
    p.add_argument("--threads", type=int, default=0,
                   help="compute threads per process (0: the machine's cores divided by the processes)")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds a process waits for the others to join or answer before it fails")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="batch size per process")
    p.add_argument("--k", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--lr", type=float, default=0.002, help="Adam learning rate")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage (the second has twice as many)")
    p.add_argument("--blocks", type=int, default=1, help="residual blocks per stage")
    p.add_argument("--dropout", type=float, default=0.2, help="dropout rate before the dense head")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--limit", type=int, default=0, help="use at most this many training examples (0: all)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args(argv)
    if min(args.procs, args.k, args.epochs, args.width, args.blocks) < 1 or args.batch < 2:
        p.error("--procs, --k, --epochs, --width and --blocks must be at least 1, --batch at least 2")
    if not 0 <= args.dropout < 1:
        p.error("--dropout must be in [0, 1)")
    if args.threads <= 0:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.procs)
    return args


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
    # Pixels scaled to [0, 1]; the model standardises them.
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def build_model(torch, args):
    nn = torch.nn

    def conv(cin, cout, size, stride):
        # Padded by size//2 on every side: goaccel's side pads the same way.
        return nn.Conv2d(cin, cout, size, stride=stride, padding=size // 2, bias=False)

    def bn(c):
        return nn.BatchNorm2d(c, eps=BN_EPSILON, momentum=BN_MOMENTUM)

    class Standardise(nn.Module):
        """[batch, 28, 28] pixels in [0, 1] → standardised [batch, 1, 28, 28]."""

        def forward(self, x):
            return ((x - PIXEL_MEAN) / PIXEL_STD).unsqueeze(1)

    class BasicBlock(nn.Module):
        """conv 3×3 – BN – ReLU – conv 3×3 – BN, plus the shortcut, then ReLU."""

        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = conv(cin, cout, 3, stride), bn(cout)
            self.conv2, self.bn2 = conv(cout, cout, 3, 1), bn(cout)
            self.relu = nn.ReLU(inplace=True)
            self.shortcut = None
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(conv(cin, cout, 1, stride), bn(cout))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return self.relu(y + (x if self.shortcut is None else self.shortcut(x)))

    w = args.width
    layers = [Standardise(), conv(1, w, 3, 1), bn(w), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
    cin = w
    for stage, channels in enumerate([w, 2 * w]):
        for block in range(args.blocks):
            layers.append(BasicBlock(cin, channels, 2 if stage > 0 and block == 0 else 1))
            cin = channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(args.dropout), nn.Linear(cin, 10)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def shard(n, epoch, rank, procs, seed):
    """This rank's examples for one epoch: a permutation the same on every rank, dealt round-robin and cut
    to equal lengths so that every rank runs the same number of micro-batches (and collectives)."""
    perm = np.random.default_rng(seed + epoch).permutation(n)
    per_rank = n // procs
    return perm[rank::procs][:per_rank]


def worker(rank, args, port, results):
    """One process of the job; port is the process group's on the loopback interface."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    distributed = args.procs > 1
    if distributed:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        dist.init_process_group("gloo", rank=rank, world_size=args.procs,
                                timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data, "train", args.limit)
    x_test, y_test = load(args.data, "test")
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)

    module = build_model(torch, args)
    model = torch.nn.parallel.DistributedDataParallel(module) if distributed else module
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=ADAM_EPSILON)
    parameters = sum(p.numel() for p in module.parameters())
    # Shuffles are drawn before the clock starts: data loading is not what is compared.
    shards = [torch.from_numpy(shard(len(y_train), e, rank, args.procs, args.seed)) for e in range(args.epochs)]

    model.train()
    if distributed:
        dist.barrier()
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

    correct = 0
    if rank == 0:
        # Batch normalization on its running averages, dropout off.
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
    summary = dict(impl="pytorch", torch=torch.__version__, model="resnet", width=args.width, blocks=args.blocks,
                   parameters=parameters, world_size=args.procs, threads_per_process=args.threads,
                   epochs=args.epochs, batch_size=args.batch, accumulation_steps=args.k, optimizer_steps=steps,
                   train_examples=len(y_train), train_seconds=round(train_seconds, 6),
                   examples_per_second=examples / train_seconds, test_accuracy=correct / len(y_test),
                   final_loss=loss_sum / max(batches, 1))
    if results is not None:
        results.put(summary)
    else:
        print(json.dumps(summary), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    args = parse_args(argv)
    limit_threads(args.threads)
    if args.procs == 1:
        worker(0, args, None, None)
        return 0
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(worker, args=(args, free_port(), results), nprocs=args.procs, join=True,
                       start_method="spawn")
    print(json.dumps(results.get()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
