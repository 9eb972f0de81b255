"""Core speed: adapter overhead, the fused default, import cost, plugin resolution.

    python benchmarks/bench_core.py [--sizes 10 100] [--repeats 15]

Prints a markdown table. Step ratios are measured side by side in one process
(interleaved, the order reversed every other round; ms/step is the median of
the rounds, a ratio the median of the per-round ratios, each pair having run
back to back under the same load); the bandwidth bound is bytes moved per step
divided by the stream bandwidth (``a.add_(b)``, 12 bytes per element), sampled
once per round between the timed steps and taken as the median of those rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

import optcore

from common import StreamProbe, machine, transformer_shaped  # benchmarks/common.py


def step_times(opts: dict[str, torch.optim.Optimizer], repeats: int, probe: StreamProbe) -> dict[str, list[float]]:
    """Seconds of each optimizer's step, one sample per round, the optimizers
    interleaved, with one bandwidth sample from ``probe`` in every round."""
    for opt in opts.values():
        for g in opt.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    p.grad = torch.randn_like(p) * 1e-3
        opt.step()  # state allocation
    samples: dict[str, list[float]] = {k: [] for k in opts}
    order = list(opts.items())
    for i in range(repeats):
        probe()
        for name, opt in order if i % 2 == 0 else order[::-1]:  # neither of a pair always goes first
            t = time.perf_counter()
            opt.step()
            samples[name].append(time.perf_counter() - t)
    return samples


def fresh(params: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for p in params:
        q = p.detach().clone().requires_grad_()
        q.grad = p.grad.clone() if p.grad is not None else torch.randn_like(p) * 1e-3
        out.append(q)
    return out


def import_cost(runs: int = 7) -> float:
    """Median seconds ``import optcore`` takes after ``import torch``, each in a
    fresh process (timed inside it: process start-up noise is not counted)."""
    code = "import time, torch; t = time.perf_counter(); import optcore; print(time.perf_counter() - t)"
    times = [
        float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
        for _ in range(runs)
    ]
    return statistics.median(times)


def plugin_resolution(n_dists: int = 50) -> tuple[float, float]:
    """Median seconds (7 fresh processes) for the first and a later resolve of a
    plugin name with ``n_dists`` extra distributions declaring optcore entry
    points. optcore's own modules are imported before the clock starts (their
    cost is the lazy part of ``import optcore``, ~5 ms, reported separately)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(n_dists):
            info = root / f"optcore_fake{i}-1.0.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: optcore-fake{i}\nVersion: 1.0\n")
            (info / "entry_points.txt").write_text(f"[optcore.optimizers]\nFake{i} = optcore_fake{i}:Fake\n")
        code = textwrap.dedent(
            f"""
            import sys, time, torch, optcore
            import optcore._registry  # optcore's own modules: part of the lazy import, timed above
            sys.path.insert(0, {str(root)!r})
            t = time.perf_counter()
            spec = optcore.resolve("Fake{n_dists - 1}")
            first = time.perf_counter() - t
            t = time.perf_counter()
            optcore.resolve("Fake0")
            print(first, time.perf_counter() - t)
            """
        )
        runs = [
            tuple(map(float, subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                            text=True).stdout.split()))
            for _ in range(7)
        ]
        return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 100], help="millions of parameters")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="also write the results (docs/figures.py renders the README from them)")
    args = parser.parse_args()
    record: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
                    "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": []}
    if hasattr(os, "getloadavg"):
        record["load_average"] = round(os.getloadavg()[0], 1)
    torch.set_num_threads(os.cpu_count() or 1)
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads{load}\n")
    bandwidths = []
    print("| params | optimizer | variant | ms/step | x bound | ratio |")
    print("|---|---|---|---|---|---|")
    for millions in args.sizes:
        base = [p.requires_grad_() for p in transformer_shaped(millions * 1e6)]
        n = sum(p.numel() for p in base)
        for name, cls, bytes_per, kwargs in (
            ("AdamW", torch.optim.AdamW, 28, {"lr": 1e-3}),
            ("SGD", torch.optim.SGD, 20, {"lr": 1e-3, "momentum": 0.9}),
        ):
            cfg = {"type": name, "no_decay": False, **kwargs}
            opts = {
                "torch fused": cls(fresh(base), fused=True, **kwargs),
                "optcore fused": optcore.build_optimizer({**cfg, "fused": True}, fresh(base)),
                "torch default": cls(fresh(base), **kwargs),
                "optcore default": optcore.build_optimizer(cfg, fresh(base)),
            }
            probe = StreamProbe()
            samples = step_times(opts, args.repeats, probe)
            t = {k: statistics.median(v) for k, v in samples.items()}

            def paired(a: str, b: str, samples: dict[str, list[float]] = samples) -> float:
                """Median of the per-round ratios: each pair ran back to back, under the same load."""
                return statistics.median(x / y for x, y in zip(samples[a], samples[b]))

            bw = probe.median()
            bandwidths.append(f"{n / 1e6:.0f}M {name} {bw / 1e9:.1f} (best {probe.best() / 1e9:.1f})")
            bound = n * bytes_per / bw
            del probe
            rows = [
                ("torch fused", "1.00 (reference)"),
                ("optcore fused", f"{paired('optcore fused', 'torch fused'):.3f} vs torch fused (goal <= 1.02)"),
                ("torch default", "1.00 (reference)"),
                ("optcore default", f"{paired('optcore default', 'torch default'):.3f} vs torch default"
                 + (" (goal <= 0.4)" if name == "AdamW" else "")),
            ]
            record["rows"].append(
                {
                    "params": n,
                    "optimizer": name,
                    "bytes_per_param": bytes_per,
                    "bandwidth": bw,
                    "ms": {k: v * 1e3 for k, v in t.items()},
                    "x_bound": {k: v / bound for k, v in t.items()},
                    "fused_ratio": paired("optcore fused", "torch fused"),
                    "default_ratio": paired("optcore default", "torch default"),
                }
            )
            for variant, ratio in rows:
                print(f"| {n / 1e6:.0f}M | {name} | {variant} | {t[variant] * 1e3:.1f} | {t[variant] / bound:.2f} | {ratio} |")
            del opts
    print("\nstream bandwidth a.add_(b), GB/s, median of the rounds interleaved with the steps: "
          + "; ".join(bandwidths))
    cost = import_cost()
    first, again = plugin_resolution()
    print(f"\nimport optcore after import torch: {cost * 1e3:.1f} ms (goal <= 30 ms)")
    print(f"resolve a plugin name among 50 entry-point distributions: first {first * 1e3:.2f} ms "
          f"(goal <= 5 ms), cached {again * 1e6:.0f} us")
    record.update(import_ms=cost * 1e3, plugin_first_ms=first * 1e3, plugin_cached_us=again * 1e6)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
