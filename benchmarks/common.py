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

import statistics
import time

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
