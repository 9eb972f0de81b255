"""A small vision task on generated data: a 2-layer CNN classifies 16x16
images of 10 classes, each a fixed random pattern, shifted by up to 2 pixels,
scaled, and drowned in noise (sigma 3: hard enough that optimizers separate in 300 steps). Nothing to download; the data come from a seed.

Why: convolutions, biases and a classifier head behave differently under
optimizers than attention does; this is the second shape of model to check a
choice on, and it trains in seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F

CLASSES, SIZE = 10, 16


class VisionTask:
    """The task protocol for a small CNN (:meth:`model`) on synthetic images."""

    name = "vision"
    loss_label = "cross-entropy (nats/image)"

    def __init__(self, batch_size: int = 64, noise: float = 3.0, heldout_batches: int = 4) -> None:
        self.batch_size, self.noise, self.heldout_batches = batch_size, noise, heldout_batches
        g = torch.Generator().manual_seed(1234)  # the classes are the same in every run
        smooth = torch.ones(1, 1, 5, 5) / 25
        raw = torch.randn(CLASSES, 1, SIZE + 4, SIZE + 4, generator=g)
        patterns = F.conv2d(raw, smooth)
        self.patterns = (patterns - patterns.mean((2, 3), keepdim=True)) / patterns.std((2, 3), keepdim=True)

    def describe(self) -> str:
        return f"small CNN on synthetic {SIZE}x{SIZE} images ({CLASSES} classes, noise {self.noise}), batch {self.batch_size}"

    def model(self) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * (SIZE // 4) ** 2, 64), nn.ReLU(), nn.Linear(64, CLASSES),
        )  # fmt: skip

    def _batch(self, g: torch.Generator) -> tuple[Tensor, Tensor]:
        labels = torch.randint(0, CLASSES, (self.batch_size,), generator=g)
        shifts = torch.randint(-2, 3, (self.batch_size, 2), generator=g).tolist()
        images = torch.stack([torch.roll(self.patterns[c], s, dims=(1, 2)) for c, s in zip(labels.tolist(), shifts)])
        scale = 0.5 + torch.rand(self.batch_size, 1, 1, 1, generator=g)
        return images * scale + self.noise * torch.randn(images.shape, generator=g), labels

    def batches(self, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(seed)
        while True:
            yield self._batch(g)

    def heldout(self, seed: int) -> list[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(10_000 + seed)
        return [self._batch(g) for _ in range(self.heldout_batches)]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(model(x.to(next(model.parameters()).dtype)).float(), y)
