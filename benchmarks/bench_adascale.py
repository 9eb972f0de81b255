"""AdaScaleSGD against torch.optim.SGD with the same momentum, on CPU, one process.

    python benchmarks/bench_adascale.py                 # ~10M parameters
    python benchmarks/bench_adascale.py --sizes 10M 100M

Both optimizers update the same transformer-shaped parameters (attention and
MLP weights plus bias and norm vectors) with momentum 0.9 and
``num_gradients_to_accumulate=2``. Ratios are against the faster of torch's SGD
variants (its CPU default per-tensor loop, and ``foreach=True``), all measured
side by side in interleaved rounds in one process, best round each:

* ``step``: ``opt.step()`` alone (target: AdaScale within 1.05x of SGD).
* ``hooks / backward``: what AdaScale adds to one backward pass, measured as
  the time of a backward-like sequence (``torch.autograd.backward`` on the
  leaves with a gradient each, which runs AccumulateGrad and so the tensor
  hooks, plus the end-of-backward callback) on AdaScale's parameters minus the
  same on SGD's (no hooks).
* ``iteration``: ``zero_grad`` + two such gradient deliveries + ``step``: the
  optimizer's whole share of an accumulation-2 step, hooks counted (target:
  AdaScale at most 1.5x SGD). A real model's forward and backward, absent here,
  would dilute the difference.

Bounds: bytes that must move / ``stream_bandwidth`` (in-place ``add_``, 12 bytes
per fp32 element), measured in the same rounds. The SGD-momentum step reads p,
g, buf and writes p, buf (20 B per parameter); AdaScale's step needs no more
(its norm of g is taken while g is in cache); its hooks read each delivered
gradient once (4 B per parameter per backward: the floor).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

from optcore_adascale import AdaScaleSGD

from common import stream_bandwidth, transformer_shaped  # benchmarks/common.py

ACCUM = 2
SGD = "torch.optim.SGD(momentum=0.9, foreach=True)"
SGD_DEFAULT = "torch.optim.SGD(momentum=0.9), CPU default (per-tensor loop)"
ADASCALE = "AdaScaleSGD(momentum=0.9, accumulation 2)"


CLOCK: Callable[[], float] = time.perf_counter


def timed(fn: Callable[[], None], reps: int) -> float:
    fn()
    start = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - start) / reps


def bench(n_params: float, d_model: int, rounds: int, reps: int) -> dict[str, float]:
    base = transformer_shaped(n_params, d_model)
    n = sum(p.numel() for p in base)
    deliveries = [[torch.randn_like(p) for p in base] for _ in range(ACCUM)]
    runs: dict[str, dict] = {}
    for name, make in {
        SGD: lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True),
        SGD_DEFAULT: lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
        ADASCALE: lambda ps: AdaScaleSGD(ps, lr=1e-3, momentum=0.9, num_gradients_to_accumulate=ACCUM),
    }.items():
        params = [p.clone().requires_grad_() for p in base]
        runs[name] = {"opt": make(params), "params": params,
                      "step": float("inf"), "deliver": float("inf"), "iteration": float("inf")}

    def deliver(run: dict) -> None:
        run["opt"].zero_grad()
        for grads in deliveries:  # one gradient per accumulation step, through autograd (fires the hooks)
            torch.autograd.backward(run["params"], grads)

    bandwidth = 0.0
    for _ in range(rounds):
        bandwidth = max(bandwidth, stream_bandwidth())
        for run in runs.values():
            deliver(run)
            run["step"] = min(run["step"], timed(run["opt"].step, reps))
            # a delivery without a step: leave the accumulation finished for the next round's step
            run["deliver"] = min(run["deliver"], timed(lambda run=run: deliver(run), reps))

            def iteration(run: dict = run) -> None:
                deliver(run)
                run["opt"].step()

            run["iteration"] = min(run["iteration"], timed(iteration, reps))

    sgd = {key: min(runs[name][key] for name in (SGD, SGD_DEFAULT)) for key in ("step", "deliver", "iteration")}
    step_bound = 20 * n / bandwidth
    hook_bound = 4 * n / bandwidth
    print(f"\n### {n / 1e6:.1f}M parameters ({len(base)} tensors), {torch.get_num_threads()} threads, "
          f"stream bandwidth {bandwidth / 1e9:.1f} GB/s (in-place add_, 12 B/elem)\n")
    print("| optimizer | step ms | step vs SGD | hooks ms / backward | iteration ms | iteration vs SGD |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, run in runs.items():
        hooks = max(run["deliver"] - sgd["deliver"], 0.0) / ACCUM
        print(f"| {name} | {run['step'] * 1e3:.2f} | {run['step'] / sgd['step']:.2f}x | "
              f"{hooks * 1e3:.2f} | {run['iteration'] * 1e3:.2f} | {run['iteration'] / sgd['iteration']:.2f}x |")
    print(f"| bound (bytes / stream bandwidth) | {step_bound * 1e3:.2f} | | {hook_bound * 1e3:.2f} | "
          f"{(step_bound + ACCUM * hook_bound) * 1e3:.2f} (step + hooks) | |")
    ada = runs[ADASCALE]
    return {"step_ratio": ada["step"] / sgd["step"], "iteration_ratio": ada["iteration"] / sgd["iteration"],
            "hooks_ms": max(ada["deliver"] - sgd["deliver"], 0.0) / ACCUM * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["10M"], choices=["10M", "100M"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="cpu: this process's CPU time (time.process_time), which other processes' load does not "
        "inflate; for ratios on a busy shared machine (with --threads 1 it is the work done)",
    )
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, clock: {args.clock}")
    for size in args.sizes:
        n, d = {"10M": (10e6, 256), "100M": (100e6, 768)}[size]
        result = bench(n, d, args.rounds, args.reps)
        print(f"\nAdaScale: step {result['step_ratio']:.2f}x SGD (target <= 1.05x), "
              f"iteration {result['iteration_ratio']:.2f}x SGD (target <= 1.5x), "
              f"hooks {result['hooks_ms']:.2f} ms per backward")


if __name__ == "__main__":
    main()
