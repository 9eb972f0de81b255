"""Adafactor against AdamW under FSDP2 (``fully_shard``) on 2 gloo ranks, on CPU.

    python benchmarks/bench_fsdp2.py                    # ~2M parameters
    python benchmarks/bench_fsdp2.py --sizes 2M 10M --rounds 5 --reps 3 \\
        --json docs/results/bench_fsdp2.json

``--sizes tiny`` (~0.2M parameters) exists for the tests only: its timings
mean nothing.

Two spawned ranks shard the same transformer-shaped parameters (attention and
MLP weights, bias and norm vectors; :func:`common.transformer_shaped`) with
``fully_shard`` over a 1-D mesh, and step them with optcore-adafactor's
Adafactor (its defaults: relative step, factored second moment) and with
optcore's AdamW (torch's, foreach over the DTensor shards: FSDP2 refuses
fused kernels), each on its own copy, gradients set once. Only ``opt.step()``
is timed: Adafactor's two all-reduces of its statistics are inside it, FSDP2's
own collectives (all-gather, reduce-scatter) are not, and AdamW has none.

Rounds interleave the two optimizers (their order alternates), each round
timing ``--reps`` steps of each after a barrier; a round's time of an
optimizer is the slower rank's (the next step waits for it). The ratio is
Adafactor's over AdamW's per round: the median is reported (target <= 1.5x)
with the range over rounds, and the ms columns are the median rounds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import transformer_shaped, write_results  # noqa: E402  benchmarks/common.py

#: size name -> (parameters, d_model)
SIZES = {"tiny": (2e5, 64), "2M": (2e6, 256), "10M": (1e7, 512)}
CONFIGS = {
    "Adafactor": {"type": "optcore-adafactor:Adafactor"},
    "AdamW": {"type": "AdamW", "lr": 1e-3, "weight_decay": 0.01},
}


class Holder(nn.Module):
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.params = nn.ParameterList([nn.Parameter(t.clone()) for t in tensors])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _count_all_reduces(opt: Any) -> int:
    import torch.distributed as dist

    calls = []
    saved = dist.all_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return saved(*args, **kwargs)

    dist.all_reduce = counting
    try:
        opt.step()
    finally:
        dist.all_reduce = saved
    return len(calls)


def _rank(rank: int, world: int, port: int, out: str, sizes: list[str], rounds: int, reps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import optcore

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    mesh = init_device_mesh("cpu", (world,))
    rows = []
    for size in sizes:
        n, d = SIZES[size]
        tensors = transformer_shaped(n, d)
        runs = {}
        for name, config in CONFIGS.items():
            model = fully_shard(Holder(tensors), mesh=mesh)
            torch.manual_seed(rank)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
                p.grad.to_local().normal_(std=1e-2)  # this rank's shard of the gradient
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt = optcore.build_optimizer(config, model.parameters())
            for _ in range(2):  # state created, first-step checks done
                opt.step()
            runs[name] = opt
        all_reduces = _count_all_reduces(runs["Adafactor"])
        times: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(rounds):
            for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    runs[name].step()
                mine = torch.tensor([(time.perf_counter() - start) / reps * 1e3], dtype=torch.float64)
                dist.all_reduce(mine, op=dist.ReduceOp.MAX)
                times[name].append(float(mine))
        ratios = [a / b for a, b in zip(times["Adafactor"], times["AdamW"])]
        rows.append({
            "size": size, "params": sum(t.numel() for t in tensors), "tensors": len(tensors), "world_size": world,
            "adafactor_step_ms": statistics.median(times["Adafactor"]), "adamw_step_ms": statistics.median(times["AdamW"]),
            "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
            "adafactor_all_reduces_per_step": all_reduces,
        })
    if rank == 0:
        torch.save(rows, Path(out, "rows.pt"))
    dist.barrier()
    dist.destroy_process_group()


def bench(sizes: list[str], rounds: int, reps: int, world: int = 2) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-fsdp2-") as out:
        mp.start_processes(_rank, args=(world, _free_port(), out, sizes, rounds, reps), nprocs=world,
                           start_method="spawn")
        return torch.load(Path(out, "rows.pt"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["2M"], choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the rows")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, 2 gloo ranks, 1 thread each")
    load = os.getloadavg()[0]
    rows = bench(args.sizes, args.rounds, args.reps)
    for row in rows:
        low, high = row["ratio_range"]
        print(f"{row['size']:>5} ({row['params'] / 1e6:.1f}M params, {row['tensors']} tensors): "
              f"Adafactor {row['adafactor_step_ms']:.2f} ms, AdamW {row['adamw_step_ms']:.2f} ms per step: "
              f"{row['ratio']:.2f}x (rounds {low:.2f}-{high:.2f}; target <= 1.5x), "
              f"{row['adafactor_all_reduces_per_step']} all-reduces per Adafactor step")
    if args.json:
        write_results(args.json, "bench_fsdp2.py", argv, load, rounds=args.rounds, reps=args.reps, world_size=2,
                      backend="gloo", rows=rows)


if __name__ == "__main__":
    main()
