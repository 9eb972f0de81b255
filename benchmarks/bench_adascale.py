"""AdaScaleSGD against torch.optim.SGD with the same momentum, on CPU, one process.

    python benchmarks/bench_adascale.py                 # ~10M parameters
    python benchmarks/bench_adascale.py --sizes 10M 100M
    python benchmarks/bench_adascale.py --sizes 10M 100M --threads 1 --rounds 5 --reps 3 \\
        --json docs/results/bench_adascale.json         # the README's table (docs/figures.py renders it)

``--sizes tiny`` (~0.2M parameters, d_model 64) exists for the tests only: it
runs every code path in seconds, and its timings mean nothing (the tensors fit
in cache).

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

Bounds: bytes that must move at the stream bandwidth (:class:`common.StreamProbe`:
one in-place ``a.add_(b)`` over 256 MB, 12 bytes per fp32 element) measured
just before and just after each timed run. The SGD-momentum step reads p, g,
buf and writes p, buf (20 B per parameter); AdaScale's step needs no more (its
norm of g is taken while g is in cache); its hooks read each delivered gradient
once (4 B per parameter per backward: the floor). "x bound" pairs each round's
AdaScale run with the bandwidth of its own moment (the hooks of a round: its
AdaScale delivery minus the faster SGD delivery of the same round) and gives
the median over rounds, their range beside it; the ms columns are best rounds,
the bound in brackets is at the median bandwidth. With ``--clock cpu`` the
times are CPU time and the bandwidth stays wall clock: on a quiet machine with
one thread the two agree, on a busy one the ratios mix two clocks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from optcore_adascale import AdaScaleSGD

from common import StreamProbe, transformer_shaped, write_results  # benchmarks/common.py

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


def bench(n_params: float, d_model: int, rounds: int, reps: int) -> dict:
    """Time both, print the table, return AdaScale's row (for ``--json``)."""
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
        runs[name] = {"opt": make(params), "params": params, "step": [], "deliver": [], "iteration": []}

    def deliver(run: dict) -> None:
        run["opt"].zero_grad()
        for grads in deliveries:  # one gradient per accumulation step, through autograd (fires the hooks)
            torch.autograd.backward(run["params"], grads)

    probe = StreamProbe()

    def paired(fn: Callable[[], None]) -> tuple[float, float]:
        """(seconds per call, add_ bandwidth at that moment: the probe just before and just after)."""
        before = probe()
        seconds = timed(fn, reps)
        return seconds, (before + probe()) / 2

    for _ in range(rounds):
        for run in runs.values():
            deliver(run)
            run["step"].append(paired(run["opt"].step))
            # a delivery without a step: leave the accumulation finished for the next round's step
            run["deliver"].append(paired(lambda run=run: deliver(run)))

            def iteration(run: dict = run) -> None:
                deliver(run)
                run["opt"].step()

            run["iteration"].append(paired(iteration))

    best = {name: {key: min(t for t, _ in run[key]) for key in ("step", "deliver", "iteration")} for name, run in runs.items()}
    sgd = {key: min(best[name][key] for name in (SGD, SGD_DEFAULT)) for key in ("step", "deliver", "iteration")}
    step_bound = 20 * n / probe.median()
    hook_bound = 4 * n / probe.median()
    print(f"\n### {n / 1e6:.1f}M parameters ({len(base)} tensors), {torch.get_num_threads()} threads; "
          f"add_ {probe.median() / 1e9:.1f} GB/s median ({min(probe.samples) / 1e9:.0f}-{probe.best() / 1e9:.0f}, "
          "12 B/elem)\n")
    print("| optimizer | step ms | step vs SGD | hooks ms / backward | iteration ms | iteration vs SGD |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in runs:
        b = best[name]
        hooks = max(b["deliver"] - sgd["deliver"], 0.0) / ACCUM
        print(f"| {name} | {b['step'] * 1e3:.2f} | {b['step'] / sgd['step']:.2f}x | "
              f"{hooks * 1e3:.2f} | {b['iteration'] * 1e3:.2f} | {b['iteration'] / sgd['iteration']:.2f}x |")
    print(f"| bound (bytes / median stream bandwidth) | {step_bound * 1e3:.2f} | | {hook_bound * 1e3:.2f} | "
          f"{(step_bound + ACCUM * hook_bound) * 1e3:.2f} (step + hooks) | |")

    ada = runs[ADASCALE]
    step_x = [t / (20 * n / add) for t, add in ada["step"]]
    hooks_x = []  # per round: AdaScale's delivery minus the faster SGD delivery of that round, per backward
    for r, (t, add) in enumerate(ada["deliver"]):
        sgd_t = min(runs[name]["deliver"][r][0] for name in (SGD, SGD_DEFAULT))
        hooks_x.append(max(t - sgd_t, 0.0) / ACCUM / (4 * n / add))
    print(f"\nAdaScale, paired with the bandwidth of each round: step {statistics.median(step_x):.2f}x its bound "
          f"({min(step_x):.2f}-{max(step_x):.2f}), hooks {statistics.median(hooks_x):.2f}x theirs "
          f"({min(hooks_x):.2f}-{max(hooks_x):.2f})")
    b = best[ADASCALE]
    return {
        "params": n, "d_model": d_model, "tensors": len(base),
        "step_ms": b["step"] * 1e3, "sgd_step_ms": sgd["step"] * 1e3, "step_ratio": b["step"] / sgd["step"],
        "step_x_bound": statistics.median(step_x), "step_x_bound_range": [min(step_x), max(step_x)],
        "step_bound_ms": step_bound * 1e3,
        "hooks_ms": max(b["deliver"] - sgd["deliver"], 0.0) / ACCUM * 1e3, "hooks_bound_ms": hook_bound * 1e3,
        "hooks_x_bound": statistics.median(hooks_x), "hooks_x_bound_range": [min(hooks_x), max(hooks_x)],
        "iteration_ms": b["iteration"] * 1e3, "sgd_iteration_ms": sgd["iteration"] * 1e3,
        "iteration_ratio": b["iteration"] / sgd["iteration"], "add_gbs": probe.median() / 1e9,
        "best_ms": {name: {key: v * 1e3 for key, v in times.items()} for name, times in best.items()},
    }


#: size -> (params, d_model); "tiny" is for the tests (see the module docstring)
SIZES = {"tiny": (2e5, 64), "10M": (10e6, 256), "100M": (100e6, 768)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["10M"], choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="cpu: this process's CPU time (time.process_time), which other processes' load does not "
        "inflate; for ratios on a busy shared machine (with --threads 1 it is the work done)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows (docs/figures.py renders the plugin README from them)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, clock: {args.clock}")
    rows, load = [], os.getloadavg()[0]
    for size in args.sizes:
        n, d = SIZES[size]
        result = bench(n, d, args.rounds, args.reps)
        rows.append(result)
        print(f"\nAdaScale: step {result['step_ratio']:.2f}x SGD (target <= 1.05x), "
              f"iteration {result['iteration_ratio']:.2f}x SGD (target <= 1.5x), "
              f"hooks {result['hooks_ms']:.2f} ms per backward")
    if args.json:
        write_results(args.json, "bench_adascale.py", argv, load, rounds=args.rounds, reps=args.reps,
                      clock=args.clock, rows=rows)


if __name__ == "__main__":
    main()
