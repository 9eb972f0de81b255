"""Adafactor step time on CPU: optcore_adafactor.Adafactor against its peers.

    python benchmarks/bench_adafactor.py                  # ~10M and ~100M parameters
    python benchmarks/bench_adafactor.py --sizes 10M      # the quick one
    python benchmarks/bench_adafactor.py --beta1 0.9      # with a first moment too
    python benchmarks/bench_adafactor.py --device cuda    # on a GPU

All implementations update the same transformer-shaped parameters (attention
and MLP weights of d x d, 4d x d and d x 4d, plus bias and norm vectors) with
the same gradients, in relative-step mode (the default everywhere it exists),
interleaved in rounds in one process. Each steps its own copy of the
parameters, as in training: optcore's C loops check that p is as they left it
(see below), and p stepped by another optimizer in between is, every round.

The bound is the memory traffic a step must have, at the stream bandwidth
(:class:`common.StreamProbe`: one in-place ``a.add_(b)`` over 256 MB, 12 bytes
per element) measured just before and just after each timed run, so each run
is held against the bandwidth of its own moment: on this shared VM the probe
alone swings 2x from second to second, and holding a step's best round
against the probe's best round, taken seconds apart, mixes two moments.
"x bound" is the median over rounds of these paired ratios, their range
beside it; ms/step is each implementation's best round, and "x HF" compares
best rounds.

An fp32 Adafactor step must read p and g and write p: 12 bytes per parameter
(20 with a first moment: read and write m too); the factored statistics are a
few KB per matrix. Adafactor's own floor is higher, because the update may
only start once the statistics of the whole matrix are known: one pass reads
g, the second reads g and p and writes p: 16 bytes per parameter, 1.33x the
bound counting every byte alike. RMS(p), which scales the step in
relative-step mode, would take a read of p in the first pass too (20 bytes);
optcore's C loops take it instead from the sum of squares the second pass
computes as it writes p, and check it against the p the next second pass
reads (a fix-up pass when p was changed in between), so from the second step
on both modes move 16 bytes. Peers that are not installed are left out.

optcore's Adafactor runs in each of its implementations: ``c`` (C loops for
fp32 CPU matrices), ``torch`` (chunked torch ops) and ``compiled`` (the update
through torch.compile; its compile time is spent in the warm-up, not timed).

``--baseline DIR`` times another checkout's optcore_adafactor too (``DIR`` is
that plugin's ``src`` folder, e.g. ``/path/to/main/plugins/optcore-adafactor/src``),
loaded under another module name, in the same rounds: a change's ratios and
the ones it is measured against come from one run.

Peers: transformers' Adafactor (the reference semantics), pytorch_optimizer's
AdaFactor, timm.optim.Adafactor and torch.optim.Adafactor (its own semantics
and defaults; no beta1).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from common import StreamProbe, sync, transformer_shaped, write_results  # benchmarks/common.py

Factory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]








PEERS = {"enabled": True}
#: another checkout's optcore_adafactor ``src`` folder to time beside this one (``--baseline``)
BASELINE: dict[str, str | None] = {"src": None}
#: optcore's implementations to time (``--ours``)
OURS = ["c", "torch", "compiled"]


#: hyper-parameters of each mode, for ours and transformers' alike
MODES = {
    "relative": {},  # the default everywhere: step size from the step count, scaled by RMS(p)
    "manual": {"lr": 1e-3, "relative_step": False, "scale_parameter": False},  # an external lr (a schedule)
}


def implementations(beta1: float | None, mode: str) -> dict[str, Factory]:
    """name -> factory for ours and every installed peer (in manual mode only
    transformers', whose switches are the same as ours)."""
    from optcore_adafactor import Adafactor

    extra = MODES[mode]
    impls: dict[str, Factory] = {
        f"optcore_adafactor ({impl})": lambda ps, impl=impl: Adafactor(ps, beta1=beta1, implementation=impl, **extra)
        for impl in OURS
    }
    peers: dict[str, tuple[str, str, dict]] = {
        "transformers Adafactor": ("transformers.optimization", "Adafactor", {"beta1": beta1, **extra}),
        "pytorch_optimizer.AdaFactor": ("pytorch_optimizer", "AdaFactor", {"lr": None, "betas": (beta1, 0.999)}),
        "timm.optim.Adafactor": ("timm.optim", "Adafactor", {"lr": None, "beta1": beta1}),
    }
    if beta1 is None:
        peers["torch.optim.Adafactor"] = ("torch.optim", "Adafactor", {})
    if not PEERS["enabled"] or mode != "relative":
        peers = {k: v for k, v in peers.items() if k == "transformers Adafactor"}  # the x HF column needs it
    if BASELINE["src"]:
        base = load_baseline(BASELINE["src"])
        impls.update({
            f"optcore_adafactor ({impl}, baseline)": lambda ps, impl=impl: base(ps, beta1=beta1, implementation=impl, **extra)
            for impl in OURS
        })
    for name, (module, attr, kwargs) in peers.items():
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as exc:  # noqa: BLE001 - a missing or broken peer is only reported
            print(f"skipping {name}: {type(exc).__name__}: {exc}")
            continue
        impls[name] = lambda ps, cls=cls, kw=kwargs: cls(ps, **kw)
    return impls


def load_baseline(src: str) -> type[torch.optim.Optimizer]:
    """``Adafactor`` of the optcore_adafactor package in ``src``, imported as
    ``baseline_optcore_adafactor`` so that it does not replace this one."""
    package = Path(src) / "optcore_adafactor"
    spec = importlib.util.spec_from_file_location(
        "baseline_optcore_adafactor", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline: no optcore_adafactor package in {src}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Adafactor  # type: ignore[no-any-return]


def state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def floor_seconds(n: int, beta1: float | None, add: float, read: float) -> float:
    """Adafactor's own floor on this machine for ``n`` fp32 parameters: pass 1
    only reads g, at the read-only rate; pass 2 reads g and p and writes p, an
    add's pattern, at the add's rate (with beta1 it also reads and writes m:
    8 bytes more at that rate). In both modes: RMS(p) needs no read of its own
    (see the module docstring)."""
    pass1 = 4 * n / read
    pass2 = (12 if beta1 is None else 20) * n / add
    return pass1 + pass2


def bench(
    n_params: float, d_model: int, rounds: int, steps: int, beta1: float | None, device: str, mode: str
) -> list[dict]:
    """Time every implementation, print the table, return its rows (for ``--json``)."""
    params = transformer_shaped(n_params, d_model, device)
    gen = torch.Generator().manual_seed(1)
    grads = [(torch.randn(p.shape, generator=gen) * 1e-2).to(device) for p in params]
    n = sum(p.numel() for p in params)

    def own_copy() -> list[torch.Tensor]:
        """The same values, but tensors of its own: an optimizer owns its parameters (see the module docstring)."""
        copies = [p.clone() for p in params]
        for p, g in zip(copies, grads):
            p.grad = g.clone()
        return copies

    opts = {name: make(own_copy()) for name, make in implementations(beta1, mode).items()}
    bytes_per_step = 4 * (3 if beta1 is None else 5) * n
    probe, reads = StreamProbe(device), StreamProbe(device, kind="read")
    times: dict[str, list[float]] = {name: [] for name in opts}
    ratios: dict[str, list[float]] = {name: [] for name in opts}
    floors: dict[str, list[float]] = {name: [] for name in opts}
    for opt in opts.values():
        opt.step()  # warm-up (state creation, scratch buffers, compilation)
    for _ in range(rounds):
        for name, opt in opts.items():
            opt.step()
            add_before, read_before = probe(), reads()
            sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            sync(device)
            seconds = (time.perf_counter() - start) / steps
            add, read = (add_before + probe()) / 2, (read_before + reads()) / 2
            times[name].append(seconds * 1e3)
            ratios[name].append(seconds / (bytes_per_step / add))
            floors[name].append(seconds / floor_seconds(n, beta1, add, read))
    best = {name: min(ms) for name, ms in times.items()}
    bound = bytes_per_step / probe.median() * 1e3
    floor = floor_seconds(n, beta1, probe.median(), reads.median()) * 1e3
    hf = best.get("transformers Adafactor", float("nan"))
    where = f"{torch.get_num_threads()} threads" if device == "cpu" else torch.cuda.get_device_name(device)
    print(f"\n### {n / 1e6:.1f}M parameters (d_model {d_model}, {len(params)} tensors), {mode} mode, beta1={beta1}, "
          f"{where}; add_ {probe.median() / 1e9:.1f} GB/s median ({min(probe.samples) / 1e9:.0f}-"
          f"{probe.best() / 1e9:.0f}), read-only {reads.median() / 1e9:.1f} GB/s; bound {bound:.1f} ms/step, "
          f"Adafactor's floor {floor:.1f} ms = {floor / bound:.2f}x the bound\n")
    print("| implementation | ms/step (best) | x bound (median of rounds) | x bound (range) | x floor (median) | x HF | state MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in sorted(opts, key=best.__getitem__):
        r = ratios[name]
        print(f"| {name} | {best[name]:.1f} | {statistics.median(r):.2f} | {min(r):.2f}-{max(r):.2f} | "
              f"{statistics.median(floors[name]):.2f} | {best[name] / hf:.2f} | {state_bytes(opts[name]) / 1e6:.2f} |")
        rows.append({
            "params": n, "mode": mode, "beta1": beta1, "implementation": name, "best_ms": best[name],
            "x_bound": statistics.median(r), "x_bound_range": [min(r), max(r)],
            "x_floor": statistics.median(floors[name]), "floor_x_bound": floor / bound, "x_hf": best[name] / hf,
            "add_gbs": probe.median() / 1e9, "read_gbs": reads.median() / 1e9,
        })
    del opts
    gc.collect()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10M,100M", help="comma-separated from 10M, 100M")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--beta1", type=float, default=None, help="first-moment coefficient (default: none)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: cores)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", default="relative", help="comma-separated from relative, manual (see MODES)")
    parser.add_argument("--ours", default=",".join(OURS), help="optcore implementations to time (c,torch,compiled)")
    parser.add_argument("--peers", default="all", help="'all', or 'none' for optcore's implementations only")
    parser.add_argument("--baseline", metavar="DIR", help="another checkout's plugin src folder to time beside this one")
    parser.add_argument("--json", metavar="PATH", help="also write the rows (docs/figures.py renders the plugin README from them)")
    args = parser.parse_args()
    unknown = [m for m in args.modes.split(",") if m.strip() not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    torch.set_num_threads(args.threads)
    OURS[:] = [x.strip() for x in args.ours.split(",") if x.strip()]
    PEERS["enabled"] = args.peers != "none"
    BASELINE["src"] = args.baseline
    configs = {"10M": (10e6, 512, 5), "100M": (100e6, 1024, 2)}  # size -> (params, d_model, steps per round)
    rows, load = [], os.getloadavg()[0]
    for size in args.sizes.split(","):
        n_params, d_model, steps = configs[size.strip()]
        for mode in args.modes.split(","):
            rows += bench(n_params, d_model, args.rounds, steps, args.beta1, args.device, mode.strip())
    if args.json:
        write_results(args.json, "bench_adafactor.py", None, load, rounds=args.rounds, rows=rows)


if __name__ == "__main__":
    main()
