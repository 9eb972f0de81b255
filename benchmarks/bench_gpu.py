"""The plugin optimizers against torch's fused AdamW and their best installed peers, on one device.

    python benchmarks/bench_gpu.py --device cuda                 # ~100M parameters
    python benchmarks/bench_gpu.py --device cuda --params 1e9
    python benchmarks/bench_gpu.py --device cpu --params 1e6     # slow, but runs anywhere

Four groups, each timed on its own copy of the same transformer-shaped
parameters and gradients, every entry of a group interleaved with the others
round by round in this one process (median of the rounds):

* Lion: optcore-lion:Lion against lion-pytorch, torch-optimi and
  pytorch_optimizer (their Triton kernels too, on CUDA when Triton imports);
* Adafactor: optcore-adafactor:Adafactor (relative step, no beta1) against
  transformers' (the reference semantics), pytorch_optimizer's and torch's;
* FP16Optimizer: optcore-fp16's fp32 master copy of fp16 parameters around
  fused AdamW, against the same loop written by hand and torch.amp's
  GradScaler stepping fused AdamW on fp32 parameters;
* AdaScaleSGD: optcore-adascale with momentum 0.9 and two accumulated
  gradients (delivered through autograd before each timed step, untimed),
  against fairscale's AdaScale around torch's SGD, and torch's SGD itself.

torch's fused AdamW is timed in every group, so each row also reads as a
ratio to it. The bound of a row is the bytes its step must move divided by the
device's stream bandwidth (``a.add_(b)``, 12 bytes per element), sampled once
per round between the timed steps: per fp32 parameter, AdamW 28 B (read p, g,
m, v; write p, m, v), Lion and SGD with momentum 20 B, Adafactor 12 B (its
factored statistics are a few KB per matrix), AdaScale 24 B (SGD's plus a read
of g for its norm); an fp32 master of fp16 parameters 40 B (grad copy 2 + 4,
AdamW 28, copy back 4 + 2), GradScaler's fused AdamW 32 B (its inf check reads
g once more). Peers that are not installed, or fail, are reported and left out.

Prints a markdown table and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common import StreamProbe, sync, transformer_shaped  # benchmarks/common.py

Step = Callable[[], object]
Timed = tuple[Step | None, Step]  # (untimed preparation, timed step)
LR = 1e-4


@dataclass
class Entry:
    """One row: how to build it on a copy of the parameters, and what its step must move."""

    name: str
    make: Callable[[list[torch.Tensor]], Timed]
    bytes_per_param: int
    role: str = "peer"  # "optcore", "peer" or "reference" (torch fused AdamW)
    cuda_only: bool = False


@dataclass
class Group:
    name: str
    entries: list[Entry]
    dtype: torch.dtype = torch.float32
    accumulate: int = 0  # > 0: gradients delivered through autograd this many times before each step
    results: dict[str, float] = field(default_factory=dict)


def plain(opt: torch.optim.Optimizer) -> Timed:
    return None, opt.step


def peer(module: str, attr: str, **kwargs: object) -> Callable[[list[torch.Tensor]], Timed]:
    """A peer class built lazily, so a missing package only skips its row."""

    def make(params: list[torch.Tensor]) -> Timed:
        cls = getattr(importlib.import_module(module), attr)
        return plain(cls(params, **kwargs))

    return make


def fused_adamw(params: list[torch.Tensor]) -> Timed:
    return plain(torch.optim.AdamW(params, lr=LR, weight_decay=0.1, fused=True))


REFERENCE = Entry("torch.optim.AdamW fused=True", fused_adamw, 28, role="reference")


def lion(params: list[torch.Tensor]) -> Timed:
    from optcore_lion import Lion

    return plain(Lion(params, lr=LR, weight_decay=0.1))


def adafactor(params: list[torch.Tensor]) -> Timed:
    from optcore_adafactor import Adafactor

    return plain(Adafactor(params))


def fp16_optimizer(params: list[torch.Tensor]) -> Timed:
    """The gradients are already there, as backward would leave them; the untimed
    ``backward`` of a loss that touches no parameter tells the wrapper they carry
    the current loss scale."""
    from optcore_fp16 import FP16Optimizer

    import optcore.plugin

    inner = optcore.plugin.adapt(torch.optim.AdamW)(params, lr=LR, weight_decay=0.1, fused=True)
    opt = FP16Optimizer(inner)
    zero = torch.zeros((), device=params[0].device, requires_grad=True)
    return (lambda: opt.backward(zero)), opt.step


def master_by_hand(params: list[torch.Tensor]) -> Timed:
    """fp16 grads copied into one flat fp32 buffer, fused AdamW on the flat fp32
    master, master copied back: no loss scale, no overflow check."""
    n = sum(p.numel() for p in params)
    master = torch.empty(n, dtype=torch.float32, device=params[0].device)
    master.grad = torch.empty_like(master)
    views, grad_views, offset = [], [], 0
    for p in params:
        views.append(master[offset : offset + p.numel()].view_as(p))
        grad_views.append(master.grad[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    with torch.no_grad():
        torch._foreach_copy_(views, params)
    opt = torch.optim.AdamW([master], lr=LR, weight_decay=0.1, fused=True)

    @torch.no_grad()
    def step() -> None:
        torch._foreach_copy_(grad_views, [p.grad for p in params])
        opt.step()
        torch._foreach_copy_(params, views)

    return None, step


def grad_scaler_adamw(params: list[torch.Tensor]) -> Timed:
    """torch.amp's way: fp32 parameters, GradScaler hands its scale and inf flag
    to the fused AdamW kernel. Untimed: ``update`` and ``scale`` around each step."""
    fp32 = [p.detach().float().requires_grad_() for p in params]
    for p, q in zip(params, fp32):
        q.grad = p.grad.float()
    device = params[0].device.type
    scaler = torch.amp.GradScaler(device)
    opt = torch.optim.AdamW(fp32, lr=LR, weight_decay=0.1, fused=True)
    zero = torch.zeros((), device=params[0].device)
    stepped = False

    def prepare() -> None:
        if stepped:
            scaler.update()  # what a training loop does after each step
        scaler.scale(zero)  # ... and before the next backward

    def step() -> None:
        nonlocal stepped
        scaler.step(opt)
        stepped = True

    return prepare, step


def adascale(params: list[torch.Tensor]) -> Timed:
    from optcore_adascale import AdaScaleSGD

    return plain(AdaScaleSGD(params, lr=1e-3, momentum=0.9, num_gradients_to_accumulate=2))


def fairscale_adascale(params: list[torch.Tensor]) -> Timed:
    from fairscale.optim import AdaScale

    inner = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return plain(AdaScale(inner, world_size=1, num_gradients_to_accumulate=2))


def groups() -> list[Group]:
    return [
        Group("Lion", [
            Entry("optcore-lion:Lion", lion, 20, role="optcore"),
            Entry("lion_pytorch.Lion", peer("lion_pytorch", "Lion", lr=LR, weight_decay=0.1), 20),
            Entry("lion_pytorch.Lion use_triton=True",
                  peer("lion_pytorch", "Lion", lr=LR, weight_decay=0.1, use_triton=True), 20, cuda_only=True),
            Entry("optimi.Lion foreach=True", peer("optimi", "Lion", lr=LR, weight_decay=0.1, foreach=True), 20),
            Entry("optimi.Lion triton=True", peer("optimi", "Lion", lr=LR, weight_decay=0.1, triton=True), 20,
                  cuda_only=True),
            Entry("pytorch_optimizer.Lion foreach=True",
                  peer("pytorch_optimizer", "Lion", lr=LR, weight_decay=0.1, foreach=True), 20),
            REFERENCE,
        ]),
        Group("Adafactor", [
            Entry("optcore-adafactor:Adafactor", adafactor, 12, role="optcore"),
            Entry("transformers Adafactor", peer("transformers.optimization", "Adafactor"), 12),
            Entry("pytorch_optimizer.AdaFactor", peer("pytorch_optimizer", "AdaFactor", lr=None, betas=(None, 0.999)),
                  12),
            Entry("torch.optim.Adafactor foreach=True", peer("torch.optim", "Adafactor", foreach=True), 12),
            REFERENCE,
        ]),
        Group("FP16Optimizer", [
            Entry("optcore-fp16:FP16Optimizer(AdamW fused)", fp16_optimizer, 40, role="optcore"),
            Entry("fp32 master by hand + AdamW fused (no scale, no inf check)", master_by_hand, 40),
            Entry("torch.amp.GradScaler + AdamW fused (fp32 params)", grad_scaler_adamw, 32),
            REFERENCE,
        ], dtype=torch.float16),
        Group("AdaScaleSGD", [
            Entry("optcore-adascale:AdaScaleSGD(momentum=0.9)", adascale, 24, role="optcore"),
            Entry("fairscale AdaScale(SGD momentum=0.9)", fairscale_adascale, 24),
            Entry("torch.optim.SGD(momentum=0.9) fused=True",
                  lambda ps: plain(torch.optim.SGD(ps, lr=1e-3, momentum=0.9, fused=True)), 20),
            Entry("torch.optim.SGD(momentum=0.9) foreach=True",
                  lambda ps: plain(torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True)), 20),
            REFERENCE,
        ], accumulate=2),
    ]


def copies(base: list[torch.Tensor], grads: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    out = []
    for p, g in zip(base, grads):
        q = p.detach().to(dtype).requires_grad_()
        q.grad = g.to(dtype)
        out.append(q)
    return out


def run_group(group: Group, base: list[torch.Tensor], device: str, rounds: int, steps: int,
              skipped: list[dict[str, str]]) -> tuple[dict[str, float], float]:
    """Median seconds per step of each entry and the median stream bandwidth, sampled in the same rounds."""
    gen = torch.Generator().manual_seed(1)
    grads = [(torch.randn(p.shape, generator=gen) * 1e-3).to(device) for p in base]
    runs: dict[str, tuple[Timed, Step | None]] = {}
    for entry in group.entries:
        if entry.cuda_only and not device.startswith("cuda"):
            continue
        # fp16 rows step fp16 parameters; the reference and GradScaler rows make their own fp32 copies
        dtype = torch.float32 if entry is REFERENCE else group.dtype
        params = copies(base, grads, dtype)
        deliver = None
        if group.accumulate:
            deliveries = [grads] * group.accumulate

            def deliver(params: list[torch.Tensor] = params, deliveries: list = deliveries) -> None:
                for p in params:
                    p.grad = None
                for gs in deliveries:  # through autograd, so AdaScale's hooks fire
                    torch.autograd.backward(params, gs)

        try:
            timed = entry.make(params)
            if deliver is not None:
                deliver()
            if timed[0] is not None:
                timed[0]()
            timed[1]()  # warm-up: state allocation, kernel builds and compiles
            sync(device)
        except Exception as exc:  # noqa: BLE001 - a missing or broken peer is only reported
            skipped.append({"group": group.name, "implementation": entry.name, "reason": f"{type(exc).__name__}: {exc}"})
            print(f"skipping {group.name} / {entry.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        runs[entry.name] = (timed, deliver)
    probe = StreamProbe(device)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        probe()
        for name, ((prepare, step), deliver) in runs.items():
            total = 0.0
            for _ in range(steps):
                if deliver is not None:
                    deliver()
                if prepare is not None:
                    prepare()
                sync(device)
                start = time.perf_counter()
                step()
                sync(device)
                total += time.perf_counter() - start
            samples[name].append(total / steps)
    bandwidth = probe.median()
    del runs, probe
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {name: statistics.median(v) for name, v in samples.items()}, bandwidth


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--params", type=float, default=1e8, help="parameters per group (default 1e8)")
    parser.add_argument("--d-model", type=int, default=None, help="layer width (default 512 below 30M, else 1024)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per entry per round")
    parser.add_argument("--groups", default="Lion,Adafactor,FP16Optimizer,AdaScaleSGD")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "bench_gpu.json")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    wanted = [g.strip() for g in args.groups.split(",")]
    chosen = [g for g in groups() if g.name in wanted]
    if len(chosen) != len(wanted):
        parser.error(f"--groups: choose from {', '.join(g.name for g in groups())}")
    base = transformer_shaped(args.params, args.d_model, args.device)
    n = sum(p.numel() for p in base)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else (
        f"CPU, {torch.get_num_threads()} threads")
    rows, skipped, bandwidths = [], [], {}
    for group in chosen:
        times, bw = run_group(group, base, args.device, args.rounds, args.steps, skipped)
        bandwidths[group.name] = bw
        adamw = times.get(REFERENCE.name, math.nan)
        peers = [t for e in group.entries if e.role == "peer" and (t := times.get(e.name)) is not None]
        best_peer = min(peers, default=math.nan)
        for entry in sorted((e for e in group.entries if e.name in times), key=lambda e: times[e.name]):
            t, bound = times[entry.name], entry.bytes_per_param * n / bw
            rows.append({
                "group": group.name, "implementation": entry.name, "role": entry.role,
                "ms_per_step": t * 1e3, "bound_ms": bound * 1e3, "x_bound": t / bound,
                "x_fused_adamw": t / adamw, "x_best_peer": t / best_peer,
                "bytes_per_param": entry.bytes_per_param,
            })
    print(f"\n### {n / 1e6:.1f}M parameters ({len(base)} tensors), {where}, torch {torch.__version__}, "
          f"median of {args.rounds} rounds x {args.steps} steps\n")
    print("stream bandwidth a.add_(b), GB/s, per group: "
          + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in bandwidths.items()) + "\n")
    print("| group | implementation | ms/step | bound ms | x bound | x fused AdamW | x best peer |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        name = f"**{r['implementation']}**" if r["role"] == "optcore" else r["implementation"]
        print(f"| {r['group']} | {name} | {r['ms_per_step']:.2f} | {r['bound_ms']:.2f} | {r['x_bound']:.2f} "
              f"| {r['x_fused_adamw']:.2f} | {r['x_best_peer']:.2f} |")
    for s in skipped:
        print(f"\nskipped: {s['group']} / {s['implementation']}: {s['reason']}")
    result = {
        "device": args.device, "device_name": where, "torch": torch.__version__, "params": n,
        "rounds": args.rounds, "steps": args.steps, "stream_bandwidth": bandwidths, "rows": rows,
        "skipped": skipped,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.json}")
    return result


if __name__ == "__main__":
    main()
