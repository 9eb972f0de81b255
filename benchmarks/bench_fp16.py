"""FP16Optimizer step time against a hand-written fp32-master-copy loop, and the
memory the precision wrappers hold.

    python benchmarks/bench_fp16.py                 # ~10M and ~100M parameters
    python benchmarks/bench_fp16.py --sizes 10M     # the quick one
    python benchmarks/bench_fp16.py --sizes 10M,100M --rounds 7 --json docs/results/bench_fp16.json
                                                    # the README's tables (docs/figures.py renders them)

Both step the same transformer-shaped fp16 parameters (each its own copy)
with the same fp16 gradients, interleaved in rounds in one process.

* baseline: by hand, the fp16 grads copied into one flat fp32 buffer, torch's
  fused AdamW on the flat fp32 master, the master copied back to the fp16 params
  (no loss scale, no overflow check);
* FP16Optimizer(AdamW fused): the same plus what the wrapper adds — dividing
  out the loss scale and the inf/NaN check that makes a skipped step safe (a
  read-only sum check of the flat fp32 gradients, the scale handed to the fused
  AdamW kernel, which writes the unscaled gradient back).

The lower bound is the memory traffic of the baseline, 40 bytes per parameter
(grad copy: read 2, write 4; AdamW: read p, g, m, v, write p, m, v = 28; copy
back: read 4, write 2), at the stream bandwidth (:class:`common.StreamProbe`:
one in-place ``a.add_(b)`` over 256 MB, 12 bytes per element) measured just
before and just after each timed run, so each run is held against the
bandwidth of its own moment. "vs bound" is the median over rounds of these
paired ratios, their range beside it; step ms is each side's best round, and
"vs hand-written loop" compares best rounds.

``--sizes tiny`` (~0.2M parameters, d_model 64) exists for the tests only: it
runs every code path in seconds, and its timings mean nothing (the tensors fit
in cache). ``--json PATH`` also writes the rows (docs/figures.py renders the
plugin README's tables from them).

Memory: bytes each wrapper holds besides the model's parameters and gradients,
split into the fp32 copy of the parameters (master and its gradient) and the
optimizer state, found by walking the tensors the wrapper and its inner
optimizer reference.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from common import StreamProbe, transformer_shaped, write_results  # benchmarks/common.py

BYTES_PER_PARAM = 40

CLOCK: Callable[[], float] = time.perf_counter


class HandWrittenMasterLoop:
    """The reference: flat fp32 master + grad buffers, torch's fused AdamW, copies."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        n = sum(p.numel() for p in params)
        self.master = torch.empty(n, dtype=torch.float32)
        self.master.grad = torch.empty_like(self.master)
        self.views, self.grad_views, offset = [], [], 0
        for p in params:
            self.views.append(self.master[offset : offset + p.numel()].view_as(p))
            self.grad_views.append(self.master.grad[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        with torch.no_grad():
            torch._foreach_copy_(self.views, params)
        self.optimizer = torch.optim.AdamW([self.master], lr=1e-4, weight_decay=0.1, fused=True)

    @torch.no_grad()
    def step(self) -> None:
        torch._foreach_copy_(self.grad_views, [p.grad for p in self.params])
        self.optimizer.step()
        torch._foreach_copy_(self.params, self.views)


def build_fp16(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    from optcore_fp16 import FP16Optimizer

    import optcore.plugin

    inner = optcore.plugin.adapt(torch.optim.AdamW)(params, lr=1e-4, weight_decay=0.1, fused=True)
    return FP16Optimizer(inner)


Timed = tuple[Callable[[], None] | None, Callable[[], None]]  # (untimed preparation, timed step)


def fp16_step(opt: torch.optim.Optimizer) -> Timed:
    """The gradients are already there, as backward would leave them (loss
    scale included). Untimed: ``backward`` of a loss that touches no parameter,
    which tells the wrapper the gradients carry the current loss scale."""
    return (lambda: opt.backward(torch.zeros((), requires_grad=True))), opt.step


def paired_times(fns: dict[str, Timed], rounds: int, steps: int, probe: StreamProbe) -> dict[str, list[tuple[float, float]]]:
    """Per entry, one (seconds per step, add_ bandwidth at that moment) per round,
    the entries interleaved round by round and the probe sampled just before and
    just after each timed run (the bandwidth is the mean of the two)."""

    def run(prepare: Callable[[], None] | None, step: Callable[[], None]) -> float:
        total = 0.0
        for _ in range(steps):
            if prepare is not None:
                prepare()
            start = CLOCK()
            step()
            total += CLOCK() - start
        return total / steps

    for prepare, step in fns.values():  # warm-up: state allocation, kernel selection
        if prepare is not None:
            prepare()
        step()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (prepare, step) in fns.items():
            before = probe()
            seconds = run(prepare, step)
            samples[name].append((seconds, (before + probe()) / 2))
    return samples


def held_bytes(opt: torch.optim.Optimizer, model_params: list[torch.Tensor]) -> tuple[int, int]:
    """(bytes of fp32 parameter copies and their grads, bytes of optimizer state)
    that ``opt`` holds beyond the model's own parameters and gradients."""
    model_storages = {p.untyped_storage().data_ptr() for p in model_params}
    model_storages |= {p.grad.untyped_storage().data_ptr() for p in model_params if p.grad is not None}
    inner = getattr(opt, "optimizer", opt)
    seen: set[int] = set()

    def size(t: torch.Tensor) -> int:
        ptr = t.untyped_storage().data_ptr()
        if ptr in model_storages or ptr in seen:
            return 0
        seen.add(ptr)
        return t.untyped_storage().nbytes()

    copies = 0
    for group in inner.param_groups:
        for p in group["params"]:
            copies += size(p) + (size(p.grad) if p.grad is not None else 0)
    state = sum(size(v) for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return copies, state


def memory_rows(params: list[torch.Tensor]) -> list[tuple[str, int, int]]:
    """Step each wrapper once and measure what it holds."""
    from optcore_fp16 import MemoryEfficientFP16Optimizer

    rows = []
    opt = build_fp16(params)
    prepare, step = fp16_step(opt)
    prepare()
    step()
    rows.append(("FP16Optimizer(AdamW)", *held_bytes(opt, params)))
    del opt
    gc.collect()
    try:
        from optcore_lion import Lion
    except ImportError:
        print("optcore-lion is not installed: MemoryEfficientFP16Optimizer row left out")
        return rows
    opt = MemoryEfficientFP16Optimizer(Lion(params, lr=1e-4))
    prepare, step = fp16_step(opt)
    prepare()
    step()
    rows.append(("MemoryEfficientFP16Optimizer(Lion)", *held_bytes(opt, params)))
    return rows


#: (label in the table, key in ``bench``'s timings)
IMPLEMENTATIONS = (
    ("hand-written fp32 master loop (fused AdamW)", "baseline"),
    ("FP16Optimizer(AdamW fused)", "fp16"),
)


def bench(n_params: float, d_model: int, rounds: int, steps: int) -> tuple[list[dict], list[dict]]:
    """Time both, print the tables, return (speed rows, memory rows) for ``--json``."""
    params = [(p * 0.02).half().requires_grad_() for p in transformer_shaped(n_params, d_model)]  # an fp16 model
    for p in params:
        p.grad = (torch.randn_like(p, dtype=torch.float32) * 10).half()
    n = sum(p.numel() for p in params)
    # the hand-written loop gets its own copy of the model: both update in place
    ref_params = [p.detach().clone().requires_grad_() for p in params]
    for p, q in zip(ref_params, params):
        p.grad = q.grad.clone()
    loop = HandWrittenMasterLoop(ref_params)
    fp16 = build_fp16(params)
    timed = {"baseline": (None, loop.step), "fp16": fp16_step(fp16)}
    probe = StreamProbe()
    samples = paired_times(timed, rounds, steps, probe)
    assert fp16.skipped_steps == 0, "the benchmark's gradients overflowed"
    best = {key: min(t for t, _ in runs) for key, runs in samples.items()}
    bound = BYTES_PER_PARAM * n / probe.median()

    print(
        f"\n### {n / 1e6:.1f}M parameters (d_model={d_model}, {len(params)} tensors, fp16), "
        f"{torch.get_num_threads()} threads; add_ {probe.median() / 1e9:.1f} GB/s median "
        f"({min(probe.samples) / 1e9:.0f}-{probe.best() / 1e9:.0f}), bound ({BYTES_PER_PARAM} B/param) "
        f"{bound * 1e3:.1f} ms\n"
    )
    print("| implementation | step ms (best) | vs hand-written loop | vs bound (median of rounds) | vs bound (range) |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for name, key in IMPLEMENTATIONS:
        ratios = [t / (BYTES_PER_PARAM * n / add) for t, add in samples[key]]
        x_loop = best[key] / best["baseline"]
        print(f"| {name} | {best[key] * 1e3:.1f} | {x_loop:.3f}x | {statistics.median(ratios):.2f}x | "
              f"{min(ratios):.2f}-{max(ratios):.2f} |")
        rows.append({
            "params": n, "d_model": d_model, "tensors": len(params), "implementation": name, "key": key,
            "best_ms": best[key] * 1e3, "x_loop": x_loop, "x_bound": statistics.median(ratios),
            "x_bound_range": [min(ratios), max(ratios)], "bound_ms": bound * 1e3, "add_gbs": probe.median() / 1e9,
        })

    del fp16, loop, ref_params
    gc.collect()
    print("\n| wrapper | fp32 param copy + its grad (B/param) | optimizer state (B/param) |")
    print("|---|---:|---:|")
    memory = []
    for name, copies, state in memory_rows(params):
        print(f"| {name} | {copies / n:.2f} ({copies / 2**20:.0f} MiB) | {state / n:.2f} ({state / 2**20:.0f} MiB) |")
        memory.append({"params": n, "wrapper": name, "copies_bytes": copies, "state_bytes": state})
    return rows, memory


#: size -> (params, d_model); "tiny" is for the tests (see the module docstring)
SIZES = {"tiny": (2e5, 64), "10M": (10e6, 512), "100M": (100e6, 1024)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10M,100M", help="comma-separated: 10M, 100M (tiny: for the tests)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="steps per round (default: 20 below 50M, 4 above)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="cpu: this process's CPU time (time.process_time), which other processes' load does not "
        "inflate; for ratios on a busy shared machine (with --threads 1 it is the work done)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows (docs/figures.py renders the plugin README from them)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    unknown = [s for s in args.sizes.split(",") if s.strip() not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)}; choose from {', '.join(SIZES)}")
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", UserWarning)
    print(f"torch {torch.__version__}, clock: {args.clock}")
    rows, memory, load = [], [], os.getloadavg()[0]
    for size in args.sizes.split(","):
        n_params, d_model = SIZES[size.strip()]
        speed, held = bench(n_params, d_model, args.rounds, args.steps or (20 if n_params < 50e6 else 4))
        rows += speed
        memory += held
    if args.json:
        write_results(args.json, "bench_fp16.py", argv, load, rounds=args.rounds, memory=memory, rows=rows)


if __name__ == "__main__":
    main()
