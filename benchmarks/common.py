"""What every benchmark here shares: the parameter sets and the bandwidth bound.

Each benchmark measures its ratios side by side in one process; the bound it
prints is the bytes its step must move divided by :func:`copy_bandwidth`,
measured in the same run.
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
