"""Lion: EvoLved Sign Momentum (Chen et al. 2023, "Symbolic Discovery of
Optimization Algorithms", arXiv:2302.06675, Algorithm 2).

    given lr, beta1, beta2, weight decay wd;  state: momentum m = 0
    c <- beta1 * m + (1 - beta1) * g       interpolate momentum and gradient
    p <- p * (1 - lr * wd)                 decoupled weight decay
    p <- p - lr * sign(c)                  every coordinate moves by exactly lr
    m <- beta2 * m + (1 - beta2) * g       update the momentum

One state tensor per parameter (AdamW keeps two). :func:`lion_update` is the
whole step. It runs per tensor (on CPU in cache-sized chunks, so memory is read
once per step rather than once per op), as ``torch._foreach_*`` ops per
(device, dtype), or, for fp32 CPU tensors, as a one-pass C kernel
(:mod:`optcore_lion._cpu_kernel`), which is the CPU default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from optcore import LR, Betas, ConfigError, Flag, HParams, OptionalFlag, Optimizer, WeightDecay, validate_hparams
from pydantic import Field
from torch import Tensor

from . import _cpu_kernel

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_CHUNK = 1 << 18  # elements per CPU chunk: p, g, m and c chunks (4 MiB in fp32) stay in cache between ops


class LionConfig(HParams):
    """Hyper-parameters of :class:`Lion`; the defaults are the paper's."""

    lr: LR = Field(1e-4, description="learning rate; each coordinate moves by lr per step: ~3-10x less than AdamW's")
    betas: Betas = Field((0.9, 0.99), description="(beta1, beta2): beta1 mixes momentum and gradient into the "
                         "update, beta2 decays the momentum")
    weight_decay: WeightDecay = Field(0.0, description="decoupled weight decay (p *= 1 - lr*wd); use ~3-10x AdamW's")
    maximize: Flag = Field(False, description="maximize the objective instead of minimizing it")
    foreach: OptionalFlag = Field(None, description="True: torch._foreach_* ops per (device, dtype); False: a "
                                  "per-tensor loop; None: foreach on accelerators")
    fused: OptionalFlag = Field(None, description="True: the one-pass C kernel (fp32 CPU tensors only); None: use "
                                "it where it applies; False: never")


def lion_update(p: Tensor, g: Tensor, m: Tensor, c: Tensor, *, lr: float, weight_decay: float,
                beta1: float, beta2: float, gscale: float) -> None:
    """One Lion step on matching tensors, in place; ``c`` is scratch of ``m``'s shape and dtype.

    ``gscale`` (``±1/scale``; negative to maximize) multiplies the gradient. It is
    folded into the two scalars that multiply ``g``: ``sign(c)`` would not need it,
    but the momentum does, and this way the gradient is never rescaled in a pass of its own.
    """
    torch.mul(m, beta1, out=c).add_(g, alpha=(1 - beta1) * gscale)  # c = b1*m + (1-b1)*g
    if weight_decay:
        p.mul_(1 - lr * weight_decay)                                 # p = p * (1 - lr*wd)
    p.add_(c.sign_(), alpha=-lr)                                      # p = p - lr * sign(c)
    m.mul_(beta2).add_(g, alpha=(1 - beta2) * gscale)                 # m = b2*m + (1-b2)*g


def _forloop_lion(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                  scratch: dict[torch.dtype, Tensor], **hp: float) -> None:
    """:func:`lion_update` per tensor. fp16/bf16 parameters are updated through an fp32
    copy and written back rounded; CPU tensors go in chunks through preallocated scratch."""
    for p, g, m in zip(params, grads, exp_avgs):
        if p.device.type != "cpu" or not (p.is_contiguous() and g.is_contiguous() and m.is_contiguous()):
            work = p.to(m.dtype)
            lion_update(work, g, m, torch.empty_like(m), **hp)
            if work is not p:
                p.copy_(work)
            continue
        if m.dtype not in scratch:
            scratch[m.dtype] = torch.empty(2, _CHUNK, dtype=m.dtype)
        buf, p1, g1, m1 = scratch[m.dtype], p.view(-1), g.view(-1), m.view(-1)
        for start in range(0, p1.numel(), _CHUNK):
            end = min(start + _CHUNK, p1.numel())
            chunk = p1[start:end]
            work = buf[1, : end - start].copy_(chunk) if p.dtype != m.dtype else chunk
            lion_update(work, g1[start:end], m1[start:end], buf[0, : end - start], **hp)
            if work is not chunk:
                chunk.copy_(work)


def _foreach_lion(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], *, lr: float,
                  weight_decay: float, beta1: float, beta2: float, gscale: float) -> None:
    """:func:`lion_update` as ``torch._foreach_*`` ops, one batch per (device, dtype)."""
    batches: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], ...]] = {}
    for p, g, m in zip(params, grads, exp_avgs):
        for bucket, t in zip(batches.setdefault((p.device, p.dtype), ([], [], [])), (p, g, m)):
            bucket.append(t)
    for ps, gs, ms in batches.values():
        work = [p.to(m.dtype) for p, m in zip(ps, ms)]  # fp32 copies of fp16/bf16 params
        gs = [g.to(m.dtype) for g, m in zip(gs, ms)]
        cs = torch._foreach_mul(ms, beta1)                       # c = b1*m + (1-b1)*g
        torch._foreach_add_(cs, gs, alpha=(1 - beta1) * gscale)
        if weight_decay:
            torch._foreach_mul_(work, 1 - lr * weight_decay)     # p = p * (1 - lr*wd)
        torch._foreach_sign_(cs)                                 # p = p - lr * sign(c)
        torch._foreach_add_(work, cs, alpha=-lr)
        torch._foreach_mul_(ms, beta2)                           # m = b2*m + (1-b2)*g
        torch._foreach_add_(ms, gs, alpha=(1 - beta2) * gscale)
        if work[0] is not ps[0]:
            torch._foreach_copy_(ps, work)


def _check_flags(values: dict[str, Any]) -> None:
    if values.get("foreach") and values.get("fused"):
        raise ConfigError(
            "Lion: foreach=True and fused=True ask for two implementations; set only one of them.",
            problems=[("foreach", "conflicts with fused=True"), ("fused", "conflicts with foreach=True")],
            target="Lion",
        )


class Lion(Optimizer):
    """Lion (Chen et al. 2023): sign of interpolated momentum, one state tensor per parameter.

    Capabilities: fp16/bf16 parameters are updated in fp32 with fp32 momentum;
    ``step(scale=s)`` and ``torch.amp.GradScaler`` fold ``1/s`` into the update;
    works on flat parameters (the update is pointwise); ``step(groups=...)``.
    """

    config_schema: ClassVar[type[HParams]] = LionConfig
    supports_memory_efficient_fp16: ClassVar[bool] = True
    supports_step_with_scale = True
    supports_flat_params: ClassVar[bool] = True
    supports_groups: ClassVar[bool] = True
    _step_supports_amp_scaling = True  # read by torch.amp.GradScaler: we unscale and skip ourselves
    conformance_inputs: ClassVar[dict[str, Any]] = {"config": {"lr": 1e-3}}  # for optcore.testing

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, maximize: bool = False, foreach: bool | None = None,
                 fused: bool | None = None) -> None:
        hparams = dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize, foreach=foreach, fused=fused)
        defaults = validate_hparams(self.config_schema, hparams, "Lion")
        _check_flags(defaults)
        self._scratch: dict[torch.dtype, Tensor] = {}  # chunk buffers of the CPU per-tensor path
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate the group's own hyper-parameters; reject complex parameters up front."""
        group = dict(param_group)
        if not isinstance(group["params"], (Tensor, set)):
            group["params"] = list(group["params"])
        own = {k: v for k, v in group.items() if k in LionConfig.model_fields}
        group.update({k: v for k, v in validate_hparams(self.config_schema, own, "Lion").items() if k in own})
        _check_flags({**self.defaults, **group})
        for p in [group["params"]] if isinstance(group["params"], Tensor) else group["params"]:
            if isinstance(p, Tensor) and p.is_complex():
                raise ConfigError(
                    f"Lion got a complex parameter of shape {tuple(p.shape)}; sign() is defined for real tensors. "
                    "Optimize torch.view_as_real(p) as a real parameter instead.",
                    problems=[("params", "complex parameter")], target="Lion",
                )
        super().add_param_group(group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Fill in hyper-parameters that older checkpoints (or lion-pytorch's) lack."""
        super().__setstate__(state)
        self.__dict__.setdefault("_scratch", {})
        for group in self.param_groups:
            for key in ("maximize", "foreach", "fused"):
                group.setdefault(key, self.defaults.get(key, LionConfig.model_fields[key].default))

    def load_state_dict(self, state_dict: dict[str, Any], optimizer_overrides: dict[str, Any] | None = None) -> None:
        """As torch's, except that fp16/bf16 parameters keep their fp32 momentum
        (torch would cast it to the parameter's dtype)."""
        saved = state_dict["state"]
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        super().load_state_dict(state_dict, optimizer_overrides)
        for i, p in zip(ids, (p for group in self.param_groups for p in group["params"])):
            if p.dtype in _LOW_PRECISION and i in saved and "exp_avg" in saved[i]:
                self.state[p]["exp_avg"] = saved[i]["exp_avg"].to(device=p.device, dtype=torch.float32)

    def _check(self, group: dict[str, Any]) -> None:
        """Raise before any update if a gradient of ``group`` cannot be used."""
        for p in group["params"]:
            if p.grad is None:
                continue
            problem = None
            if p.grad.is_sparse:
                problem = "is sparse; use nn.Embedding(sparse=False), or torch.optim.SparseAdam for those parameters"
            elif p.is_complex():
                problem = "is complex; optimize torch.view_as_real(p) instead"
            elif group["fused"] and not _cpu_kernel.eligible(p, p.grad):
                problem = "is not a contiguous fp32 CPU tensor, which fused=True needs; set fused=None"
            if problem:
                raise ConfigError(f"Lion cannot step: the gradient of a parameter of shape {tuple(p.shape)} "
                                  f"({p.dtype}, {p.device}) {problem}.", problems=[("params", problem)], target="Lion")
        if group["fused"] and _cpu_kernel.load() is None:
            raise ConfigError(f"Lion: fused=True, but the C kernel could not be built: "
                              f"{_cpu_kernel.unavailable_reason}. Set fused=None to use the eager path.",
                              problems=[("fused", "kernel unavailable")], target="Lion")

    def _gather(self, group: dict[str, Any]) -> tuple[tuple[list[Tensor], ...], ...]:
        """Create missing state and route each (param, grad, momentum) to an implementation."""
        fused, foreach, forloop = ([], [], []), ([], [], []), ([], [], [])
        use_kernel = group["fused"] or (group["fused"] is None and group["foreach"] is None)
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "exp_avg" not in state:  # fp32 momentum for fp16/bf16 params
                dtype = torch.float32 if p.dtype in _LOW_PRECISION else p.dtype
                state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
            g, m = p.grad, state["exp_avg"]
            # Sharded params (FSDP2's DTensor) go through torch ops, which know their layout.
            plain = type(p) in (Tensor, torch.nn.Parameter)
            if plain and use_kernel and _cpu_kernel.eligible(p, g, m) and _cpu_kernel.load() is not None:
                route = fused
            elif not plain or group["foreach"] or (group["foreach"] is None and p.device.type != "cpu"):
                route = foreach
            else:
                route = forloop
            for bucket, t in zip(route, (p, g, m)):
                bucket.append(t)
        return fused, foreach, forloop

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, scale: float = 1.0,
             groups: Any = None) -> float | None:
        """One update of the selected ``groups`` (all by default), gradients taken as divided by ``scale``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)  # set by torch.amp.GradScaler
        if found_inf is not None and float(found_inf):  # inf/NaN gradients: skip this step
            return loss
        grad_scale = getattr(self, "grad_scale", None)
        scale = float(scale) * (float(grad_scale) if grad_scale is not None else 1.0)
        if not 0 < scale < float("inf"):
            raise ConfigError(f"Lion.step: scale must be a positive finite number, got {scale}.",
                              problems=[("scale", "not positive and finite")], target="Lion")
        selected = self._select_groups(groups)
        for group in selected:  # every gradient is checked before anything is updated
            self._check(group)
        for group in selected:
            beta1, beta2 = group["betas"]
            hp = dict(lr=group["lr"], weight_decay=group["weight_decay"], beta1=beta1, beta2=beta2,
                      gscale=(-1.0 if group["maximize"] else 1.0) / scale)
            fused, foreach, forloop = self._gather(group)
            if fused[0]:
                _cpu_kernel.lion_fp32_(*fused, **hp)
            if foreach[0]:
                _foreach_lion(*foreach, **hp)
            if forloop[0]:
                _forloop_lion(*forloop, scratch=self._scratch, **hp)
        return loss
