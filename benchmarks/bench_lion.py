"""Lion step time on CPU: optcore_lion.Lion's implementations against each other and peers.

    python benchmarks/bench_lion.py                 # ~10M and ~100M parameters
    python benchmarks/bench_lion.py --sizes 10M     # the quick one
    python benchmarks/bench_lion.py --sizes 10M,100M --rounds 5 --json docs/results/bench_lion.json
                                                    # the README's table (docs/figures.py renders it)

``--sizes tiny`` (~0.2M parameters, d_model 64) exists for the tests only: it
runs every code path in seconds, and its timings mean nothing (the tensors fit
in cache). ``--no-compiled`` leaves ``compiled=True`` out (no torch.compile:
the tests use it); ``--no-peers`` keeps only optcore_lion's implementations.

All implementations update the same transformer-shaped parameters (stacks of
attention and MLP weights plus bias and norm vectors) with the same gradients,
interleaved in rounds in one process. The bound is the memory traffic of a Lion
step, 20 bytes per fp32 parameter (read p, g, m; write p, m), at the stream
bandwidth (:class:`common.StreamProbe`: one in-place ``a.add_(b)`` over 256 MB,
12 bytes per element, the access pattern of an update) measured just before and
just after each timed run, so each run is held against the bandwidth of its
own moment. "x bound" is the median over rounds of these paired ratios, their
range beside it; ms/step is each implementation's best round, and "x C kernel"
and "x best peer" compare best rounds.

The first step of each implementation (state creation, the C kernel's build,
or for ``compiled=True`` its compilation) is timed on its own before the
rounds: "first step ms". Set ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` for a
cold compile (otherwise inductor's on-disk cache may serve it). Peers that are
not installed are left out of the table.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import time
from collections.abc import Callable

import torch

from common import StreamProbe, transformer_shaped, write_results  # benchmarks/common.py

BYTES_PER_PARAM = 20  # Lion, fp32: read p, g, m; write p, m
KERNEL = "optcore_lion.Lion (default: one-pass C kernel)"


def implementations(
    peers: bool = True, compiled: bool = True
) -> dict[str, tuple[bool, Callable[[list[torch.Tensor]], torch.optim.Optimizer]]]:
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
    if not compiled:
        del impls["optcore_lion.Lion compiled=True (torch.compile)"]
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


def bench(n_params: float, d_model: int, rounds: int, steps: int, peers: bool = True, compiled: bool = True) -> list[dict]:
    """Time every implementation, print the table, return its rows (for ``--json``)."""
    params = transformer_shaped(n_params, d_model)
    for p in params:
        p.grad = torch.randn_like(p)
    n = sum(p.numel() for p in params)
    opts = {name: (peer, make(params)) for name, (peer, make) in implementations(peers, compiled).items()}
    probe = StreamProbe()
    first: dict[str, float] = {}
    for name, (_, opt) in opts.items():
        start = time.perf_counter()
        opt.step()  # warm-up (state creation, kernel build or compilation on first use)
        first[name] = (time.perf_counter() - start) * 1e3
    times: dict[str, list[float]] = {name: [] for name in opts}
    ratios: dict[str, list[float]] = {name: [] for name in opts}
    for _ in range(rounds):
        for name, (_, opt) in opts.items():
            before = probe()
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            seconds = (time.perf_counter() - start) / steps
            add = (before + probe()) / 2
            times[name].append(seconds * 1e3)
            ratios[name].append(seconds / (BYTES_PER_PARAM * n / add))
    best = {name: min(ms) for name, ms in times.items()}
    bound = BYTES_PER_PARAM * n / probe.median() * 1e3
    best_peer = min((best[k] for k, (peer, _) in opts.items() if peer), default=None)  # None: no peers
    kernel = best[KERNEL]
    print(f"\n### {n / 1e6:.1f}M parameters (d_model {d_model}, {len(params)} tensors), "
          f"{torch.get_num_threads()} threads; add_ {probe.median() / 1e9:.1f} GB/s median "
          f"({min(probe.samples) / 1e9:.0f}-{probe.best() / 1e9:.0f}), bound {bound:.1f} ms/step\n")
    print("| implementation | ms/step (best) | x bound (median of rounds) | x bound (range) | x C kernel | x best peer | first step ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in sorted(opts, key=best.__getitem__):
        r = ratios[name]
        x_peer = None if best_peer is None else best[name] / best_peer
        print(f"| {name} | {best[name]:.1f} | {statistics.median(r):.2f} | {min(r):.2f}-{max(r):.2f} | "
              f"{best[name] / kernel:.2f} | {'-' if x_peer is None else format(x_peer, '.2f')} | {first[name]:.0f} |")
        rows.append({
            "params": n, "d_model": d_model, "tensors": len(params), "implementation": name, "peer": opts[name][0],
            "best_ms": best[name], "x_bound": statistics.median(r), "x_bound_range": [min(r), max(r)],
            "x_kernel": best[name] / kernel, "x_best_peer": x_peer, "first_ms": first[name],
            "bound_ms": bound, "add_gbs": probe.median() / 1e9,
        })
    compiled_name = next((k for k in opts if "compiled=True" in k), None)
    if compiled_name is not None:
        print(f"\nfirst-compile cost of compiled=True: {(first[compiled_name] - best[compiled_name]) / 1e3:.1f} s "
              "(its first step minus its best steady step)")
    del opts
    gc.collect()
    return rows


#: size -> (params, d_model, steps per round); "tiny" is for the tests (see the module docstring)
CONFIGS = {"tiny": (2e5, 64, 2), "10M": (10e6, 512, 10), "100M": (100e6, 1024, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10M,100M", help="comma-separated from 10M, 100M (tiny: for the tests)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: cores)")
    parser.add_argument("--no-peers", action="store_true", help="only optcore_lion's implementations")
    parser.add_argument("--no-compiled", action="store_true", help="leave compiled=True out (no torch.compile)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows (docs/figures.py renders the plugin README from them)")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sizes.split(",") if s.strip() not in CONFIGS]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows, load = [], os.getloadavg()[0]
    for size in args.sizes.split(","):
        n_params, d_model, steps = CONFIGS[size.strip()]
        rows += bench(n_params, d_model, args.rounds, steps, peers=not args.no_peers, compiled=not args.no_compiled)
    if args.json:
        write_results(args.json, "bench_lion.py", argv, load, rounds=args.rounds, rows=rows)


if __name__ == "__main__":
    main()
