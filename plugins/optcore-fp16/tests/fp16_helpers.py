"""Shared helpers of the optcore-fp16 tests: tiny models, native test optimizers,
state snapshots. (A uniquely named module, imported by the test files.)"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

import optcore
import optcore.plugin


def mlp(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """A small regression MLP whose initial weights are fp16-representable, so
    fp32 and half-precision runs start from exactly the same point."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model.to(dtype)


def data(seed: int = 1, n: int = 64) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = torch.sin(x[:, :4].sum(1, keepdim=True)) + 0.1 * x[:, 4:5]
    return x, y


def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    dtype = next(model.parameters()).dtype
    return ((model(x.to(dtype)).float() - y) ** 2).mean()


AdamW = optcore.plugin.adapt(torch.optim.AdamW)


def adamw(model: nn.Module, **kw: Any) -> torch.optim.Optimizer:
    kw.setdefault("lr", 1e-2)
    kw.setdefault("fused", True)
    return AdamW(model.parameters(), **kw)


class HalfSGD(optcore.Optimizer):
    """SGD with momentum for half-precision parameters: fp32 arithmetic and an
    fp32 momentum buffer, the parameter rounded once per step."""

    supports_memory_efficient_fp16: ClassVar[bool] = True
    supports_step_with_scale = True
    supports_flat_params: ClassVar[bool] = True
    supports_groups: ClassVar[bool] = True

    def __init__(self, params: Any, lr: float = 1e-2, momentum: float = 0.9) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure: Any = None, scale: float = 1.0, groups: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self._select_groups(groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
                    state["step"] = torch.zeros(())
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(p.grad.float(), alpha=1.0 / scale)
                p.copy_(p.float().add_(buf, alpha=-group["lr"]))
                state["step"] += 1
        return loss


class ShapedSGD(HalfSGD):
    """HalfSGD that pretends its update needs each parameter's shape."""

    supports_flat_params: ClassVar[bool] = False
    flat_params_unsupported_reason: ClassVar[str] = "ShapedSGD needs each parameter in its own shape."


def snapshot(opt: torch.optim.Optimizer, model: nn.Module) -> list[Tensor]:
    """Copies of every parameter and every tensor of the optimizer's state."""
    tensors = [p.detach().clone() for p in model.parameters()]
    for state in opt.state.values():
        tensors += [v.detach().clone() for v in state.values() if isinstance(v, Tensor)]
    inner = getattr(opt, "_masters", None)
    for m in inner or []:
        tensors += [t.detach().clone() for t in m.tensors]
    return tensors


def same(a: list[Tensor], b: list[Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def all_finite(tensors: list[Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def poison(model: nn.Module, kind: str) -> None:
    """Put an inf or a NaN into one gradient (as an fp16 overflow would)."""
    p = next(iter(model.parameters()))
    p.grad.view(-1)[0] = float("inf") if kind == "inf" else float("nan")
