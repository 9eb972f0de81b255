"""What every benchmark here shares: the parameter sets and the bandwidth bound.

Each benchmark measures its ratios side by side in one process; the bound it
prints is the bytes its step must move over the in-place ``a.add_(b)``
bandwidth, measured in the same rounds as the timed steps: a
:class:`StreamProbe` sampled just before and just after each timed run, so
each run is held against the bandwidth of its own moment.

Why ``a.add_(b)`` and not ``dst.copy_(src)``: a copy also reads its destination
before writing it (write-allocate), so counting 8 bytes per fp32 element for a
copy undercounts what moved and makes the "bound" look slower than memory is.
``a.add_(b)`` reads ``a`` and ``b`` and writes ``a``: 12 bytes per element, all
of them counted, the same access pattern as an optimizer's update.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def transformer_shaped(n_params: float, d_model: int | None = None, device: str = "cpu") -> list[torch.Tensor]:
    """Layers of q, k, v, out (d x d), fc1 (4d x d), fc2 (d x 4d) weights, their
    biases and two LayerNorms, to about ``n_params`` (d = 512 below 30M, else 1024)."""
    d = d_model or (512 if n_params < 3e7 else 1024)
    layer = [(d, d)] * 4 + [(4 * d, d), (d, 4 * d)] + [(d,)] * 4 + [(4 * d,), (d,)] + [(d,)] * 4
    per_layer = sum(torch.Size(s).numel() for s in layer)
    gen = torch.Generator().manual_seed(0)
    layers = max(1, round(n_params / per_layer))
    return [torch.randn(s, generator=gen).to(device) for _ in range(layers) for s in layer]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class StreamProbe:
    """The bandwidth bound, sampled one ``a.add_(b)`` at a time so a benchmark can
    take its samples in the same rounds as its timed steps (interleaved): on a
    shared machine the bound then sees the same load as the steps it bounds.

    Each call times one in-place add over fp32 tensors of ``numel`` elements
    (allocated once) and returns bytes per second, counting 12 bytes per element
    (read a, read b, write a).

    ``kind="read"`` times ``a.sum()`` instead (4 bytes per element, nothing
    written): the rate of a pass that only reads, which on some machines is
    not the add's. On the 2-vCPU AMD EPYC VM these benchmarks ran on, a
    read-only pass moves about 30 GB/s against the add's ~45 (counting 12 B):
    both handle the same number of elements per second, so reads are what
    limits, and the add's write comes nearly free (``bench_adafactor`` holds
    its two passes against both probes)."""

    def __init__(self, device: str = "cpu", numel: int = 1 << 26, kind: str = "add") -> None:
        if kind not in ("add", "read"):
            raise ValueError(f"kind must be 'add' or 'read', not {kind!r}")
        self.device, self.numel, self.kind = device, numel, kind
        self.a = torch.randn(numel, device=device)
        self.b = torch.randn(numel, device=device) if kind == "add" else None
        self._run()  # first touch: page faults and lazy init are not bandwidth
        self.samples: list[float] = []

    def _run(self) -> None:
        if self.b is not None:
            self.a.add_(self.b)
        else:
            self.a.sum()

    def __call__(self) -> float:
        sync(self.device)
        start = time.perf_counter()
        self._run()
        sync(self.device)
        moved = (12 if self.b is not None else 4) * self.numel
        self.samples.append(moved / (time.perf_counter() - start))
        return self.samples[-1]

    def median(self) -> float:
        return statistics.median(self.samples)

    def best(self) -> float:
        return max(self.samples)


def machine() -> str:
    """The machine a figure was measured on, as its footer says it: the CPU's
    model name, logical CPUs, widest x86 vector unit and last-level cache. A
    ratio to the bandwidth bound depends on all four (a working set that fits
    the cache is bound by arithmetic, not memory)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = " ".join(value.split())
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    parts = [model or platform.processor() or platform.machine(), f"{os.cpu_count() or 'unknown'} logical CPUs"]
    parts += [name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags][:1]
    try:  # Linux only; elsewhere (macOS) or where /sys hides it, the footer goes without
        caches = Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/level")
        levels = sorted(caches, key=lambda p: int(p.read_text()))
        size = cache_size((levels[-1].parent / "size").read_text()) if levels else None
    except (OSError, ValueError):
        size = None
    if size:
        parts.append(f"L{levels[-1].read_text().strip()} cache {size}")
    return ", ".join(parts)


def cache_size(text: str) -> str | None:
    """A cache size as sysfs writes it ("491520K", "1M", "32768", or "16 MB"), in
    MiB (KiB under 1 MiB); ``None`` if it reads as none of these."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        return None
    kib = int(match[1]) * {"": 1 / 1024, "K": 1, "M": 1024, "G": 1024 * 1024}[match[2].upper()]
    return f"{kib / 1024:g} MiB" if kib >= 1024 else f"{kib:g} KiB"


def write_results(path: str, script: str, argv: Sequence[str] | None, load_before: float, **fields: Any) -> None:
    """Write a benchmark's results file for docs/figures.py: the command that
    made it (as the README quotes it), when, on what machine (:func:`machine`),
    torch, threads, the load average before and after the run, and ``fields``
    (``rounds``, ``rows``, ...)."""
    args = sys.argv[1:] if argv is None else list(argv)
    cold = "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 " if os.environ.get("TORCHINDUCTOR_FORCE_DISABLE_CACHES") == "1" else ""
    record = {
        "command": cold + " ".join(["python", f"benchmarks/{script}", *args]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": fields.pop("machine", machine()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(), **{k: v for k, v in fields.items() if k != "rows"},
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)], "rows": fields.get("rows", []),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
