"""The cost of checking what torch's fused kernels are handed (optcore.guards).

    python benchmarks/bench_guards.py [--sizes 1 10] [--repeats 11] [--threads 1] [--json PATH]

The same optcore-built fused optimizer steps with the check and with it
turned off, interleaved in one process (as bench_core.py does: the order
reversed every other round, a ratio the median of the per-round ratios).
Two shapes of model: transformer-shaped (about 18 tensors per layer), and
many small tensors, where the per-tensor check weighs most. The check alone
is timed too (the median of ``--repeats`` calls on the stepped optimizer): on
a loaded machine its share of a step is steadier than a difference of steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import optcore
import optcore._adapt as adapt
from optcore.guards import check_fused_inputs
from bench_core import fresh, step_times  # benchmarks/bench_core.py
from common import StreamProbe, transformer_shaped  # benchmarks/common.py


class Unchecked:
    """``opt`` stepping with the check replaced by a no-op for its step only."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt, self.param_groups = opt, opt.param_groups

    def step(self) -> None:
        saved = adapt.check_fused_inputs
        adapt.check_fused_inputs = lambda *args: None
        try:
            self.opt.step()
        finally:
            adapt.check_fused_inputs = saved


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def models(sizes: list[float]) -> list[tuple[str, list[torch.Tensor]]]:
    out = [(f"{m:g}M transformer-shaped", transformer_shaped(m * 1e6)) for m in sizes]
    gen = torch.Generator().manual_seed(0)
    out.append(("2,000 tensors of 512", [torch.randn(512, generator=gen) for _ in range(2000)]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 10], help="millions of parameters")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads{load}\n")
    print("| model | tensors | optimizer | checked ms/step | unchecked ms/step | ratio | check alone ms | check / step |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for label, base in models(args.sizes):
        for p in base:
            p.requires_grad_()
        for name, kwargs in (("AdamW", {"lr": 1e-3}), ("SGD", {"lr": 1e-3, "momentum": 0.9})):
            checked = optcore.build_optimizer({"type": name, "no_decay": False, **kwargs}, fresh(base))
            assert checked.param_groups[0]["fused"], "the default build is fused"
            other = optcore.build_optimizer({"type": name, "no_decay": False, **kwargs}, fresh(base))
            samples = step_times({"checked": checked, "unchecked": Unchecked(other)}, args.repeats, StreamProbe())
            ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
            ratio = statistics.median(a / b for a, b in zip(samples["checked"], samples["unchecked"]))
            alone = statistics.median(_timed(lambda: check_fused_inputs(checked.param_groups, checked.state)) for _ in range(args.repeats)) * 1e3
            share = alone / ms["unchecked"]
            rows.append(dict(model=label, tensors=len(base), optimizer=name, ms=ms, ratio=ratio, check_ms=alone, check_share=share))
            print(f"| {label} | {len(base)} | {name} | {ms['checked']:.2f} | {ms['unchecked']:.2f} | {ratio:.3f} | {alone:.3f} | {share:.2%} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "threads": args.threads, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
