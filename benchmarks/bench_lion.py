"""Lion step time on CPU: optcore_lion.Lion's implementations against each other and peers.

    python benchmarks/bench_lion.py                 # ~10M and ~100M parameters
    python benchmarks/bench_lion.py --sizes 10M     # the quick one

All implementations update the same transformer-shaped parameters (stacks of
attention and MLP weights plus bias and norm vectors) with the same gradients,
interleaved in rounds in one process; each gets its best round. The lower bound
is the memory traffic of a Lion step, 20 bytes per fp32 parameter (read p, g, m;
write p, m), divided by :func:`common.stream_bandwidth` (an in-place ``add_``,
12 bytes per element, the access pattern of an update) measured in the same
rounds. ``compiled=True`` compiles on its first step: that step's extra time is
reported as the first-compile cost (set ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``
for a cold compile; otherwise inductor's on-disk cache may serve it). Peers that
are not installed are left out of the table.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import time
from collections.abc import Callable

import torch

from common import stream_bandwidth, transformer_shaped  # benchmarks/common.py

BYTES_PER_PARAM = 20  # Lion, fp32: read p, g, m; write p, m
KERNEL = "optcore_lion.Lion (default: one-pass C kernel)"


def implementations(peers: bool = True) -> dict[str, tuple[bool, Callable[[list[torch.Tensor]], torch.optim.Optimizer]]]:
    """name -> (is_peer, factory); peers whose package is missing are skipped."""
    from optcore_lion import Lion

    impls: dict[str, tuple[bool, Callable]] = {
        "optcore_lion.Lion (default: one-pass C kernel)": (False, lambda ps: Lion(ps, lr=1e-4, weight_decay=0.1)),
        "optcore_lion.Lion fused=False (chunked per-tensor)": (
            False, lambda ps: Lion(ps, lr=1e-4, weight_decay=0.1, fused=False, foreach=False)),
        "optcore_lion.Lion foreach=True": (False, lambda ps: Lion(ps, lr=1e-4, weight_decay=0.1, foreach=True)),
        "optcore_lion.Lion compiled=True (torch.compile)": (
            False, lambda ps: Lion(ps, lr=1e-4, weight_decay=0.1, compiled=True)),
    }
    if not peers:
        return impls
    others = {
        "lion_pytorch.Lion": ("lion_pytorch", "Lion", {}),
        "timm.optim.Lion": ("timm.optim", "Lion", {}),
        "timm.optim.Lion foreach=True": ("timm.optim", "Lion", {"foreach": True}),
        "pytorch_optimizer.Lion": ("pytorch_optimizer", "Lion", {}),
        "pytorch_optimizer.Lion foreach=True": ("pytorch_optimizer", "Lion", {"foreach": True}),
        "optimi.Lion": ("optimi", "Lion", {}),
        "optimi.Lion foreach=True": ("optimi", "Lion", {"foreach": True}),
    }
    for name, (module, attr, kwargs) in others.items():
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as exc:  # noqa: BLE001 - a missing or broken peer is only reported
            print(f"skipping {name}: {type(exc).__name__}: {exc}")
            continue
        impls[name] = (True, lambda ps, cls=cls, kw=kwargs: cls(ps, lr=1e-4, weight_decay=0.1, **kw))
    return impls


def bench(n_params: float, d_model: int, rounds: int, steps: int, peers: bool = True) -> None:
    params = transformer_shaped(n_params, d_model)
    for p in params:
        p.grad = torch.randn_like(p)
    n = sum(p.numel() for p in params)
    opts = {name: (peer, make(params)) for name, (peer, make) in implementations(peers).items()}
    best = {name: float("inf") for name in opts}
    first = {}
    bandwidth = 0.0
    for _ in range(rounds):
        bandwidth = max(bandwidth, stream_bandwidth())
        for name, (_, opt) in opts.items():
            start = time.perf_counter()
            opt.step()  # warm-up (state creation, kernel build or compilation on first use)
            first.setdefault(name, (time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            best[name] = min(best[name], (time.perf_counter() - start) / steps * 1e3)
    bound = BYTES_PER_PARAM * n / bandwidth * 1e3
    best_peer = min((best[k] for k, (peer, _) in opts.items() if peer), default=float("nan"))  # nan: no peers
    kernel = best[KERNEL]
    print(f"\n### {n / 1e6:.1f}M parameters (d_model {d_model}, {len(params)} tensors), "
          f"{torch.get_num_threads()} threads, stream (add_) bandwidth {bandwidth / 1e9:.1f} GB/s, "
          f"bound {bound:.1f} ms/step\n")
    print("| implementation | ms/step | x bound | x C kernel | x best peer | first step ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in sorted(opts, key=best.__getitem__):
        print(f"| {name} | {best[name]:.1f} | {best[name] / bound:.2f} | {best[name] / kernel:.2f} | "
              f"{best[name] / best_peer:.2f} | {first[name]:.0f} |")
    compiled = next(k for k in opts if "compiled=True" in k)
    print(f"\nfirst-compile cost of compiled=True: {(first[compiled] - best[compiled]) / 1e3:.1f} s "
          "(its first step minus a steady step)")
    del opts
    gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10M,100M", help="comma-separated from 10M, 100M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="only optcore_lion's implementations")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    configs = {"10M": (10e6, 512, 10), "100M": (100e6, 1024, 3)}  # size -> (params, d_model, steps per round)
    for size in args.sizes.split(","):
        n_params, d_model, steps = configs[size.strip()]
        bench(n_params, d_model, args.rounds, steps, peers=not args.no_peers)


if __name__ == "__main__":
    main()
