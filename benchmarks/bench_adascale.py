"""AdaScaleSGD against torch.optim.SGD with the same momentum, on CPU, one process.

    python benchmarks/bench_adascale.py                 # ~10M parameters
    python benchmarks/bench_adascale.py --sizes 10M 100M

Both optimizers update the same transformer-shaped parameters (attention and
MLP weights plus bias and norm vectors) with momentum 0.9 and
``num_gradients_to_accumulate=2``; ratios are against the faster of torch's
SGD variants (its CPU default per-tensor loop, and ``foreach=True``). Two timings, interleaved in rounds in one
process, best round each:

* ``step``: ``opt.step()`` alone. AdaScale adds the gradients' squared norms
  (read while each gradient is in cache for its momentum update) and a handful
  of tiny tensor ops; single process, so no all-reduce.
* ``iteration``: ``zero_grad`` + two gradient deliveries through autograd
  (``torch.autograd.backward`` on the leaves, which runs AccumulateGrad and so
  the hooks) + ``step``. AdaScale's hooks add one norm pass per delivered
  gradient; a real model's forward and backward, absent here, would dilute this.

Lower bounds: bytes moved per step / copy bandwidth measured in the same rounds.
SGD with momentum reads p, g, buf and writes p, buf (20 B per fp32 parameter);
AdaScale also reads g for its norm (24 B); the hooks read each delivered
gradient (4 B each).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

from optcore_adascale import AdaScaleSGD

from common import copy_bandwidth, transformer_shaped  # benchmarks/common.py

ACCUM = 2
SGD = "torch.optim.SGD(momentum=0.9, foreach=True)"
SGD_DEFAULT = "torch.optim.SGD(momentum=0.9), CPU default (per-tensor loop)"
ADASCALE = "AdaScaleSGD(momentum=0.9, accumulation 2)"






def timed(fn: Callable[[], None], reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def bench(n_params: float, d_model: int, rounds: int, reps: int) -> None:
    base = transformer_shaped(n_params, d_model)
    n = sum(p.numel() for p in base)
    deliveries = [[torch.randn_like(p) for p in base] for _ in range(ACCUM)]
    runs: dict[str, dict[str, float]] = {}
    bandwidth = 0.0
    for name, make in {
        SGD: lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True),
        SGD_DEFAULT: lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
        ADASCALE: lambda ps: AdaScaleSGD(
            ps, lr=1e-3, momentum=0.9, num_gradients_to_accumulate=ACCUM),
    }.items():
        params = [p.clone().requires_grad_() for p in base]
        runs[name] = {"opt": make(params), "params": params, "step": float("inf"), "iteration": float("inf")}

    def deliver(run: dict) -> None:
        run["opt"].zero_grad()
        for grads in deliveries:  # one gradient per accumulation step, through autograd (fires the hooks)
            torch.autograd.backward(run["params"], grads)

    for _ in range(rounds):
        bandwidth = max(bandwidth, copy_bandwidth())
        for run in runs.values():
            deliver(run)
            run["step"] = min(run["step"], timed(run["opt"].step, reps))

            def iteration(run: dict = run) -> None:
                deliver(run)
                run["opt"].step()

            run["iteration"] = min(run["iteration"], timed(iteration, reps))

    # ratios against the faster torch SGD, per column
    sgd = {key: min(runs[name][key] for name in (SGD, SGD_DEFAULT)) for key in ("step", "iteration")}
    bounds = {name: (20 * n, 20 * n) for name in runs}
    bounds[ADASCALE] = (24 * n, (24 + 4 * ACCUM) * n)
    print(f"\n### {n / 1e6:.1f}M parameters ({len(base)} tensors), {torch.get_num_threads()} threads, "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s\n")
    print("| optimizer | step ms | step vs best SGD | step bound ms "
          "| iteration ms | iteration vs best SGD | hooks+step bound ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, run in runs.items():
        step_bytes, iter_bytes = bounds[name]
        print(f"| {name} | {run['step'] * 1e3:.2f} | {run['step'] / sgd['step']:.2f}x | "
              f"{step_bytes / bandwidth * 1e3:.2f} | {run['iteration'] * 1e3:.2f} | "
              f"{run['iteration'] / sgd['iteration']:.2f}x | {iter_bytes / bandwidth * 1e3:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["10M"], choices=["10M", "100M"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"torch {torch.__version__}")
    for size in args.sizes:
        n, d = {"10M": (10e6, 256), "100M": (100e6, 768)}[size]
        bench(n, d, args.rounds, args.reps)


if __name__ == "__main__":
    main()
