"""AdaScaleSGD where it is meant to run: data parallel, 2 DDP ranks (gloo, CPU).

    python benchmarks/bench_adascale_ddp.py                      # ~10M parameters
    python benchmarks/bench_adascale_ddp.py --sizes 10M 100M --rounds 5 --reps 3 \\
        --json docs/results/bench_adascale_ddp.json              # the README's table (docs/figures.py)

Each rank trains a stack of transformer-shaped MLP blocks (Linear d -> 4d, GELU,
Linear 4d -> d, LayerNorm, residual) wrapped in DDP, on its own batch. One
iteration is what a training loop pays: ``zero_grad``, forward, backward (DDP's
gradient all-reduce, and AdaScale's gradient hooks) and ``step`` (AdaScale's one
all-reduce of its statistics, then the SGD update). The baseline is the same
loop with torch's SGD at the same momentum (its faster of foreach and the
per-tensor loop is not chosen here: torch's CPU default, as users run it).

The two optimizers run in interleaved rounds inside the same two processes, so
both see the same load; a round's ratio is AdaScale's time over SGD's, and the
table gives the median round with the range. Target (issue 26): 1.15x.
``--sizes tiny`` exists for the tests; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from common import write_results  # benchmarks/common.py

#: size -> (params, d_model, rows per rank's batch)
SIZES = {"tiny": (2e5, 64, 8), "10M": (10e6, 256, 32), "100M": (100e6, 768, 32)}


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2, self.norm = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d), torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))


def model(n_params: float, d: int) -> torch.nn.Module:
    per_block = 8 * d * d + 7 * d
    torch.manual_seed(0)
    return torch.nn.Sequential(*(Block(d) for _ in range(max(1, round(n_params / per_block)))))


def _rank(rank: int, world_size: int, size: str, rounds: int, reps: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optcore_adascale import AdaScaleSGD

    torch.set_num_threads(1)
    n_params, d, rows = SIZES[size]
    kw = dict(lr=0.01, momentum=0.9)
    runs = {}
    for name in ("SGD", "AdaScaleSGD"):
        net = DDP(model(n_params, d))
        opt = AdaScaleSGD(net.parameters(), **kw) if name == "AdaScaleSGD" else torch.optim.SGD(net.parameters(), **kw)
        runs[name] = (net, opt)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(rows, d, generator=gen)

    def iteration(net: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        opt.step()

    for net, opt in runs.values():  # warm-up: state allocated, DDP's buckets built
        iteration(net, opt)
        iteration(net, opt)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            net, opt = runs[name]
            dist.barrier()
            start = time.perf_counter()
            for _ in range(reps):
                iteration(net, opt)
            times[name].append((time.perf_counter() - start) / reps)
    n = sum(p.numel() for p in runs["SGD"][0].parameters())
    return {"params": n, "tensors": len(list(runs["SGD"][0].parameters())), "rows": rows, "times": times}


def bench(size: str, rounds: int, reps: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the spawned ranks import this module
    from optcore.testing._ranks import run_ranks  # the spawning tests/_dist_util.py uses too

    results = run_ranks(_rank, 2, size, rounds, reps, timeout=1800)
    first = results[0]
    # a round's time is the slower rank's: the ranks wait for each other at every all-reduce
    sgd = [max(r["times"]["SGD"][i] for r in results) for i in range(rounds)]
    ada = [max(r["times"]["AdaScaleSGD"][i] for r in results) for i in range(rounds)]
    ratios = [a / s for a, s in zip(ada, sgd)]
    row = {
        "size": size, "params": first["params"], "tensors": first["tensors"], "rows_per_rank": first["rows"],
        "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
        "adascale_ms": 1e3 * statistics.median(ada), "sgd_ms": 1e3 * statistics.median(sgd),
    }
    print(f"{size}: {row['params'] / 1e6:.1f}M params, AdaScaleSGD {row['adascale_ms']:.1f} ms vs SGD "
          f"{row['sgd_ms']:.1f} ms per iteration: {row['ratio']:.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f})")  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["10M"], choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3, help="iterations timed together in a round")
    parser.add_argument("--json", metavar="PATH", help="write the results (docs/figures.py renders them)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    torch.set_num_threads(1)  # what each rank runs with (the footer says so)
    rows = [bench(size, args.rounds, args.reps) for size in args.sizes]
    if args.json:
        write_results(args.json, "bench_adascale_ddp.py", argv, load, rounds=args.rounds, reps=args.reps,
                      world_size=2, rows=rows)  # fmt: skip


if __name__ == "__main__":
    main()
