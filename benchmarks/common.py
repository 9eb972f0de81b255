"""What every benchmark here shares: the parameter sets and the bandwidth bound.

Each benchmark measures its ratios side by side in one process; the bound it
prints is the bytes its step must move divided by :func:`stream_bandwidth`,
measured in the same rounds as the timed steps.

Why ``a.add_(b)`` and not ``dst.copy_(src)``: a copy also reads its destination
before writing it (write-allocate), so counting 8 bytes per fp32 element for a
copy undercounts what moved and makes the "bound" look slower than memory is.
``a.add_(b)`` reads ``a`` and ``b`` and writes ``a``: 12 bytes per element, all
of them counted, the same access pattern as an optimizer's update.
"""

from __future__ import annotations

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


def copy_bandwidth(device: str = "cpu", numel: int = 1 << 26, reps: int = 5) -> float:
    """Best bytes per second of ``dst.copy_(src)``, counting the read and the write."""
    src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * 4 * numel / best


def stream_bandwidth(device: str = "cpu", numel: int = 1 << 26, reps: int = 5) -> float:
    """Best bytes per second of the in-place ``a.add_(b)`` over fp32 tensors of
    ``numel`` elements, counting 12 bytes per element (read a, read b, write a)."""
    a, b = torch.randn(numel, device=device), torch.randn(numel, device=device)
    a.add_(b)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        a.add_(b)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 12 * numel / best
