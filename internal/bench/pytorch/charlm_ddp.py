#!/usr/bin/env python3
"""Trains examples/charlm's transformer with PyTorch, as the reference accelbench compares goaccel with: the
same corpus and split, architecture, initialisation, AdamW, warm-up + cosine schedule, gradient clipping,
per-process batch, gradient accumulation and optimizer steps.

The corpus is every .go file under --data (default: Go's own $GOROOT/src), in sorted order of the paths
relative to it; every 16th file (the first included) is the validation text. Windows of --context bytes are
spread over each text as the Go program spreads them. Several processes train with DistributedDataParallel
over gloo on this machine; accumulation skips the all-reduce of the first k-1 micro-batches with no_sync()
and scales each micro-batch's loss by 1/k. One process trains the plain module.

The last line on standard output is one JSON object with the fields charlm's summary line has
(tokens_per_second, examples_per_second, validation_loss, steps, parameters, ...). Training time excludes
loading the corpus and the validation.

    /usr/bin/python3 internal/bench/pytorch/charlm_ddp.py --procs 2 --steps 100
"""

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time

import numpy as np

VOCAB = 256
VALIDATION_EVERY = 16
INIT_STDDEV = 0.02
LAYER_NORM_EPS = 1e-5
ADAM_EPS = 1e-8
MLP_EXPANSION = 4
MIN_LR_FRACTION = 0.1


def default_data():
    try:
        goroot = subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        goroot = "/usr/local/go"
    return os.path.join(goroot, "src")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=1, help="processes (DDP over gloo when more than 1)")
    p.add_argument("--threads", type=int, default=0,
                   help="compute threads per process (0: the machine's cores divided by --procs)")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dmodel", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="windows per micro-batch per process")
    p.add_argument("--k", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.002, help="peak AdamW learning rate")
    p.add_argument("--wd", type=float, default=0.01, help="AdamW weight decay")
    p.add_argument("--clip", type=float, default=1.0, help="global gradient norm clip (0: none)")
    p.add_argument("--limit", type=int, default=0, help="training windows (0: all)")
    p.add_argument("--eval-windows", type=int, default=256)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data", default=None, help="root of the .go corpus (default: $GOROOT/src)")
    p.add_argument("--quiet", action="store_true", help="accepted for symmetry with charlm; prints nothing more")
    args = p.parse_args(argv)
    if min(args.procs, args.batch, args.k, args.steps, args.context, args.eval_windows) < 1:
        p.error("--procs, --batch, --k, --steps, --context and --eval-windows must be at least 1")
    if args.dmodel % args.heads:
        p.error("--heads must divide --dmodel")
    if not 0 <= args.warmup <= args.steps:
        p.error("--warmup must be in [0, --steps]")
    if args.threads <= 0:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.procs)
    if args.data is None:
        args.data = default_data()
    return args


def limit_threads(threads):
    """Every thread pool torch may use, before torch is imported."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def load_corpus(root):
    """The training and validation texts, as charlm's loadCorpus splits them."""
    paths = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            if name.endswith(".go") and os.path.isfile(full) and not os.path.islink(full):
                paths.append(os.path.relpath(full, root).replace(os.sep, "/"))
    paths.sort()
    train, validation = bytearray(), bytearray()
    for i, rel in enumerate(paths):
        with open(os.path.join(root, rel), "rb") as f:
            (validation if i % VALIDATION_EVERY == 0 else train).extend(f.read())
    if len(paths) < 2:
        raise SystemExit(f"{root} holds {len(paths)} .go files; at least 2 are needed")
    return np.frombuffer(bytes(train), dtype=np.uint8), np.frombuffer(bytes(validation), dtype=np.uint8)


def window_starts(text_len, context, count):
    n = (text_len - 1) // context
    if n < 1:
        raise SystemExit(f"a text of {text_len} bytes holds no window of {context}+1 bytes")
    if count <= 0 or count > n:
        count = n
    return np.array([(i * n // count) * context for i in range(count)], dtype=np.int64)


def windows(torch, text, starts, context):
    """Inputs [n, context] and next bytes [n, context] as int64 tensors."""
    offsets = starts[:, None] + np.arange(context + 1)[None, :]
    w = torch.from_numpy(text[offsets].astype(np.int64))
    return w[:, :-1], w[:, 1:]


def warmup_cosine(peak, warmup, total):
    def lr(step):
        if step < warmup:
            return peak * (step + 1) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return peak * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))
    return lr


def build_model(torch, args):
    nn = torch.nn
    F = torch.nn.functional
    d, heads = args.dmodel, args.heads
    head_dim = d // heads

    class Attention(nn.Module):
        """GoMLX's layers.MultiHeadAttention: per-head query, key and value projections with biases, a
        causal softmax, an output projection. GoMLX scales the query by 1/√head_dim and the logits by
        1/√head_dim again, so the scores are q·k / head_dim; this twin does the same."""

        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.output = nn.Linear(d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q = self.query(x).view(b, t, heads, head_dim)
            k = self.key(x).view(b, t, heads, head_dim)
            v = self.value(x).view(b, t, heads, head_dim)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / head_dim
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
            return self.output(out.reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = nn.LayerNorm(d, eps=LAYER_NORM_EPS), Attention()
            self.mlp_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
            self.mlp_in, self.mlp_out = nn.Linear(d, MLP_EXPANSION * d), nn.Linear(MLP_EXPANSION * d, d)

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = nn.Embedding(VOCAB, d)
            self.position_embedding = nn.Embedding(args.context, d)
            self.blocks = nn.ModuleList([Block() for _ in range(args.blocks)])
            self.final_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
            self.output = nn.Linear(d, VOCAB)
            # charlm's initialisation: weights and embeddings N(0, 0.02²), biases 0, LayerNorm gain 1.
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, INIT_STDDEV)
                    if getattr(m, "bias", None) is not None:
                        nn.init.zeros_(m.bias)

        def forward(self, tokens):
            t = tokens.shape[1]
            x = self.token_embedding(tokens) + self.position_embedding(torch.arange(t, device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.output(self.final_norm(x))

    return Transformer()


def shard(n, epoch, rank, procs, seed):
    """This rank's windows for one epoch: a permutation the same on every rank, dealt round-robin and cut to
    equal lengths so that every rank runs the same number of micro-batches (and collectives)."""
    perm = np.random.default_rng(seed + epoch).permutation(n)
    return perm[rank::procs][:n // procs]


def worker(rank, args, port, results):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    distributed = args.procs > 1
    if distributed:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    torch.manual_seed(args.seed)
    train_text, validation_text = load_corpus(args.data)
    train_starts = window_starts(len(train_text), args.context, args.limit)
    x_val, y_val = windows(torch, validation_text, window_starts(len(validation_text), args.context,
                                                                 args.eval_windows), args.context)

    module = build_model(torch, args)
    model = torch.nn.parallel.DistributedDataParallel(module) if distributed else module
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=ADAM_EPS,
                            weight_decay=args.wd)
    schedule = warmup_cosine(args.lr, args.warmup, args.steps)
    parameters = sum(p.numel() for p in module.parameters())
    if len(train_starts) // args.procs < 1:
        raise SystemExit(f"{len(train_starts)} training windows leave some process none")

    if distributed:
        dist.barrier()
    start = time.perf_counter()
    steps, local_windows, recent, epoch = 0, 0, [], 0
    while steps < args.steps:
        idx = shard(len(train_starts), epoch, rank, args.procs, args.seed)
        n_batches = (len(idx) + args.batch - 1) // args.batch
        for b in range(n_batches):
            x, y = windows(torch, train_text, train_starts[idx[b * args.batch:(b + 1) * args.batch]], args.context)
            # The optimizer steps every k micro-batches and on the epoch's last one, on the mean gradient of
            # the cycle's micro-batches, as goaccel does.
            step = (b + 1) % args.k == 0 or b == n_batches - 1
            cycle = min(args.k, n_batches - (b - b % args.k))
            if step or not distributed:
                loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
                (loss / cycle).backward()
            else:
                with model.no_sync():
                    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
                    (loss / cycle).backward()
            local_windows += len(x)
            recent = (recent + [loss.item()])[-20:]
            if step:
                if args.clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                for group in opt.param_groups:
                    group["lr"] = schedule(steps)
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps += 1
                if steps >= args.steps:
                    break
        epoch += 1
    if distributed:
        dist.barrier()
    train_seconds = time.perf_counter() - start

    validation_loss = 0.0
    if rank == 0:
        module.eval()
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(x_val), 64):
                logits = module(x_val[i:i + 64])
                total += F.cross_entropy(logits.reshape(-1, VOCAB), y_val[i:i + 64].reshape(-1),
                                         reduction="sum").item()
        validation_loss = total / y_val.numel()
    loss_sum, loss_count = sum(recent), len(recent)
    if distributed:
        # Every rank's wall time: the job is done when the slowest rank is.
        t = torch.tensor([train_seconds, local_windows, loss_sum, loss_count], dtype=torch.float64)
        gathered = [torch.zeros_like(t) for _ in range(args.procs)]
        dist.all_gather(gathered, t)
        train_seconds = max(float(g[0]) for g in gathered)
        all_windows = sum(int(g[1]) for g in gathered)
        loss_sum, loss_count = sum(float(g[2]) for g in gathered), sum(int(g[3]) for g in gathered)
        dist.destroy_process_group()
    else:
        all_windows = local_windows
    if rank != 0:
        return
    summary = dict(impl="pytorch", torch=torch.__version__, model="transformer", parameters=parameters,
                   world_size=args.procs, processes=args.procs, threads_per_process=args.threads,
                   context=args.context, d_model=args.dmodel, heads=args.heads, blocks=args.blocks,
                   batch_size=args.batch, accumulation_steps=args.k, global_batch=args.procs * args.k * args.batch,
                   steps=steps, train_examples=all_windows, train_tokens=all_windows * args.context,
                   train_seconds=round(train_seconds, 6),
                   tokens_per_second=all_windows * args.context / train_seconds,
                   examples_per_second=all_windows / train_seconds,
                   final_loss=loss_sum / max(loss_count, 1), validation_loss=validation_loss)
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
        worker(0, args, 0, None)
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
