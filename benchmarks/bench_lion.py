"""Lion step time on CPU: optcore_lion.Lion against peer Lion implementations.

    python benchmarks/bench_lion.py                 # ~10M and ~100M parameters
    python benchmarks/bench_lion.py --sizes 10M     # the quick one

All implementations update the same transformer-shaped parameters (stacks of
attention and MLP weights plus bias and norm vectors) with the same gradients,
interleaved in rounds in one process; each gets its best round. The lower bound
is the memory traffic of a Lion step, 20 bytes per fp32 parameter (read p, g, m;
write p, m), divided by the copy bandwidth measured (``Tensor.copy_`` of a large
tensor, bytes read + written) in the same rounds. Peers that are not installed
are left out of the table.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import time
from collections.abc import Callable

import torch

from common import copy_bandwidth, transformer_shaped  # benchmarks/common.py

BYTES_PER_PARAM = 20  # Lion, fp32: read p, g, m; write p, m






def implementations() -> dict[str, tuple[bool, Callable[[list[torch.Tensor]], torch.optim.Optimizer]]]:
    """name -> (is_peer, factory); peers whose package is missing are skipped."""
    from optcore_lion import Lion

    impls: dict[str, tuple[bool, Callable]] = {
        "optcore_lion.Lion (default: one-pass C kernel)": (False, lambda ps: Lion(ps, lr=1e-4, weight_decay=0.1)),
        "optcore_lion.Lion fused=False (chunked per-tensor)": (
            False, lambda ps: Lion(ps, lr=1e-4, weight_decay=0.1, fused=False, foreach=False)),
        "optcore_lion.Lion foreach=True": (False, lambda ps: Lion(ps, lr=1e-4, weight_decay=0.1, foreach=True)),
    }
    peers = {
        "lion_pytorch.Lion": ("lion_pytorch", "Lion", {}),
        "timm.optim.Lion": ("timm.optim", "Lion", {}),
        "timm.optim.Lion foreach=True": ("timm.optim", "Lion", {"foreach": True}),
        "pytorch_optimizer.Lion": ("pytorch_optimizer", "Lion", {}),
        "pytorch_optimizer.Lion foreach=True": ("pytorch_optimizer", "Lion", {"foreach": True}),
        "optimi.Lion": ("optimi", "Lion", {}),
        "optimi.Lion foreach=True": ("optimi", "Lion", {"foreach": True}),
    }
    for name, (module, attr, kwargs) in peers.items():
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as exc:  # noqa: BLE001 - a missing or broken peer is only reported
            print(f"skipping {name}: {type(exc).__name__}: {exc}")
            continue
        impls[name] = (True, lambda ps, cls=cls, kw=kwargs: cls(ps, lr=1e-4, weight_decay=0.1, **kw))
    return impls


def bench(n_params: float, d_model: int, rounds: int, steps: int) -> None:
    params = transformer_shaped(n_params, d_model)
    for p in params:
        p.grad = torch.randn_like(p)
    n = sum(p.numel() for p in params)
    opts = {name: (peer, make(params)) for name, (peer, make) in implementations().items()}
    best = {name: float("inf") for name in opts}
    bandwidth = 0.0
    for _ in range(rounds):
        bandwidth = max(bandwidth, copy_bandwidth())
        for name, (_, opt) in opts.items():
            opt.step()  # warm-up (state creation, kernel build on first use)
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            best[name] = min(best[name], (time.perf_counter() - start) / steps * 1e3)
    bound = BYTES_PER_PARAM * n / bandwidth * 1e3
    best_peer = min((best[k] for k, (peer, _) in opts.items() if peer), default=float("nan"))
    print(f"\n### {n / 1e6:.1f}M parameters (d_model {d_model}, {len(params)} tensors), "
          f"{torch.get_num_threads()} threads, copy bandwidth {bandwidth / 1e9:.1f} GB/s, "
          f"bound {bound:.1f} ms/step\n")
    print("| implementation | ms/step | x bound | x best peer |")
    print("|---|---:|---:|---:|")
    for name in sorted(opts, key=best.__getitem__):
        print(f"| {name} | {best[name]:.1f} | {best[name] / bound:.2f} | {best[name] / best_peer:.2f} |")
    del opts
    gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10M,100M", help="comma-separated from 10M, 100M")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    configs = {"10M": (10e6, 512, 10), "100M": (100e6, 1024, 3)}  # size -> (params, d_model, steps per round)
    for size in args.sizes.split(","):
        n_params, d_model, steps = configs[size.strip()]
        bench(n_params, d_model, args.rounds, steps)


if __name__ == "__main__":
    main()
