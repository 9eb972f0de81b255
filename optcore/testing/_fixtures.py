"""The small, seeded problem every check trains on.

A two-layer net with a LayerNorm (or, for optimizers that take matrices only,
two bias-free linear layers) on a fixed regression task, in any dtype of
:data:`optcore.testing.DTYPES`. Everything is seeded, so two builds of the same
config follow the same trajectory bit for bit. These helpers are the kit's
own; plugins use the checks through :func:`optcore.testing.run_check`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ._inputs import ConformanceInputs


class Net(nn.Module):
    def __init__(self, matrices_only: bool, hidden: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, hidden, bias=not matrices_only)
        self.fc2 = nn.Linear(hidden, 3, bias=not matrices_only)
        self.norm = None if matrices_only else nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if self.norm is not None:
            h = self.norm(h)
        return self.fc2(h)


def data(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 6, generator=g)
    w = torch.randn(6, 3, generator=g)
    return x.to(dtype), torch.tanh(x @ w).to(dtype)


def model(inputs: ConformanceInputs, seed: int = 0, dtype: torch.dtype = torch.float32, hidden: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return Net(inputs.matrices_only, hidden).to(dtype)


def dtype_of(m: nn.Module) -> torch.dtype:
    return next(m.parameters()).dtype


def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(m(x), y)


def full_config(config: Any, inputs: ConformanceInputs) -> dict[str, Any]:
    from .._config import typed_config

    return {**inputs.config, **typed_config(config)}


def build(config: dict[str, Any], m: nn.Module) -> Any:
    from .._build import build_optimizer

    return build_optimizer(copy.deepcopy(config), m)


def train(
    opt: Any,
    m: nn.Module,
    steps: int,
    inputs: ConformanceInputs,
    seed: int = 1,
    batch: tuple[torch.Tensor, torch.Tensor] | None = None,
    **step_kwargs: Any,
) -> list[float]:
    """The kit's one training loop: ``steps`` optimizer steps, on batch
    ``data(seed + i)`` at step ``i`` (or on ``batch`` at every step), through
    ``opt.backward`` and a closure for optimizers that evaluate it themselves.
    Returns the loss each step saw before its update."""
    losses = []
    dtype = dtype_of(m)
    fixed = batch
    for i in range(steps):
        batch = fixed if fixed is not None else data(seed + i, dtype)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            value = loss(m, batch)
            opt.backward(value)
            return value

        if inputs.needs_closure:
            value = opt.step(closure)
        else:
            value = closure()
            opt.step(**step_kwargs)
        losses.append(float(value.detach()))
    return losses


def params(m: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        if not torch.allclose(x, y, atol=atol, rtol=max(atol, 1e-5)):
            raise AssertionError(f"{what}: parameter {i} differs by {(x - y).abs().max().item():.3g} (atol {atol})")
