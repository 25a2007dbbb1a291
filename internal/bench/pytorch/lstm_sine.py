#!/usr/bin/env python3
"""Trains examples/lstm's job with PyTorch, as the reference accelbench compares goaccel with: the same
sine-continuation task drawn from the same seed, the same LSTM and dense head, initialisation, Adam settings,
batch and epochs, on one process.

The task (examples/lstm/data.go): sequence i draws a frequency w in [0.3, 0.8) and a phase in [0, 2π) from
SplitMix64 seeded with --seed; its input is sin(w·t + phase) at t = 0 … length−1 and its target the next
sample, computed in float64 and rounded to float32: the very examples goaccel's side trains on.

The model: torch.nn.LSTM (one layer, --hidden units) reads the sequence, and a dense layer maps its last
hidden state to the prediction; Adam (ε = 1e-8 on both sides) minimises the mean squared error. Weights start
as GoMLX's default initializer starts examples/lstm's: normal with standard deviation √(2 / fan-in), the fan-in
of the LSTM's input and recurrent kernels being 4 × hidden (GoMLX stores them as [1, 4, hidden, ·] and counts
4 × hidden as their fan-in) and that of its two sets of biases 8 (stored as [1, 8, hidden]); the dense layer's
weights √(2 / hidden), its bias 0. Each epoch visits the sequences in a fresh permutation in whole batches,
the last incomplete one dropped, as goaccel's loader does.

The last line on standard output is one JSON object with the fields examples/lstm's summary has
(train_examples, epochs, examples_per_second, first_loss, final_loss, parameters, ...). Training time
excludes generating the data.

    /usr/bin/python3 internal/bench/pytorch/lstm_sine.py --epochs 10
"""

import argparse
import json
import math
import os
import sys
import time

MASK64 = (1 << 64) - 1
ADAM_EPSILON = 1e-8


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=1, help="processes: the twin trains on one")
    p.add_argument("--threads", type=int, default=0, help="compute threads (0: the machine's cores)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--examples", type=int, default=2048, help="training sequences, drawn from --seed")
    p.add_argument("--length", type=int, default=16, help="samples per input sequence")
    p.add_argument("--hidden", type=int, default=32, help="LSTM units")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    if args.procs != 1:
        p.error("--procs: the LSTM twin trains on one process")
    if min(args.epochs, args.batch, args.examples, args.length, args.hidden) < 1 or not args.lr > 0:
        p.error("--epochs, --batch, --examples, --length and --hidden must be at least 1, --lr positive")
    if args.examples < args.batch:
        p.error("--examples must hold at least one whole --batch")
    if args.threads <= 0:
        args.threads = max(1, len(os.sched_getaffinity(0)))
    return args


def limit_threads(threads):
    """Every thread pool torch may use, before torch is imported: torch.set_num_threads alone leaves the
    BLAS library's own pool at the machine's core count."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


class SplitMix64:
    """SplitMix64, bit for bit as examples/lstm/data.go has it."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def float64(self):
        return (self.next() >> 11) / float(1 << 53)


def sine_data(n, length, seed):
    """n input sequences of length samples and their next samples, as float64 lists (to be rounded to
    float32): examples/lstm's sineData."""
    rng = SplitMix64(seed)
    xs, ys = [], []
    for _ in range(n):
        w = 0.3 + 0.5 * rng.float64()
        phase = 2 * math.pi * rng.float64()
        xs.append([math.sin(w * t + phase) for t in range(length)])
        ys.append(math.sin(w * length + phase))
    return xs, ys


def build_model(torch, hidden):
    nn = torch.nn

    class SineLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(input_size=1, hidden_size=hidden, batch_first=True)
            self.output = nn.Linear(hidden, 1)

        def forward(self, x):
            _, (last, _) = self.lstm(x)  # last: [1, batch, hidden]
            return self.output(last[0])

    model = SineLSTM()
    with torch.no_grad():
        for name, p in model.lstm.named_parameters():
            fan_in = 8 if name.startswith("bias") else 4 * hidden
            p.normal_(0, math.sqrt(2 / fan_in))
        model.output.weight.normal_(0, math.sqrt(2 / hidden))
        model.output.bias.zero_()
    return model


def main(argv):
    args = parse_args(argv)
    limit_threads(args.threads)
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    xs, ys = sine_data(args.examples, args.length, args.seed)
    x = torch.from_numpy(np.asarray(xs, dtype=np.float32)).unsqueeze(-1)  # [n, length, 1]
    y = torch.from_numpy(np.asarray(ys, dtype=np.float32)).unsqueeze(-1)  # [n, 1]
    model = build_model(torch, args.hidden)
    parameters = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=ADAM_EPSILON)
    # Shuffles are drawn before the clock starts, as the data is.
    batches = args.examples // args.batch
    orders = [torch.from_numpy(np.random.default_rng(args.seed + e).permutation(args.examples)) for e in range(args.epochs)]

    model.train()
    start = time.perf_counter()
    losses, steps = [], 0
    for epoch in range(args.epochs):
        order, total = orders[epoch], 0.0
        for b in range(batches):
            sel = order[b * args.batch:(b + 1) * args.batch]
            loss = F.mse_loss(model(x[sel]), y[sel])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            total += loss.item()
        losses.append(total / batches)
    train_seconds = time.perf_counter() - start

    trained = batches * args.batch
    summary = dict(impl="pytorch", torch=torch.__version__, model="lstm", hidden=args.hidden,
                   sequence_length=args.length, parameters=parameters, world_size=1,
                   threads_per_process=args.threads, epochs=args.epochs, batch_size=args.batch,
                   optimizer_steps=steps, train_examples=trained, first_loss=losses[0], final_loss=losses[-1],
                   train_seconds=round(train_seconds, 6),
                   examples_per_second=trained * args.epochs / train_seconds)
    for name in ("first_loss", "final_loss"):
        if not math.isfinite(summary[name]):
            summary[name] = None  # a diverged run: JSON has no NaN
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
