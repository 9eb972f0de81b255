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
(device, dtype), compiled with ``torch.compile`` (:mod:`optcore_lion._compiled`),
or, for fp32 CPU tensors, as a one-pass C kernel (:mod:`optcore_lion._cpu_kernel`),
which is the CPU default. Inside a ``torch.compile``'d region the step is traced
instead (the C kernel and the chunking are eager-only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from optcore import ConfigError
from optcore.plugin import (
    LR, Betas, Flag, HParams, OptionalFlag, Optimizer, WeightDecay, by_device_and_dtype, validate_hparams,
)
from pydantic import Field
from torch import Tensor

from . import _compiled, _cpu_kernel

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
    compiled: OptionalFlag = Field(None, description="True: lion_update compiled with torch.compile, once per "
                                   "(device, dtype, shapes class); None or False: not (the first step compiles "
                                   "for seconds)")


Scalar = float | Tensor  # a Python number, or a 0-d tensor (see lion_update)


def lion_update(p: Tensor, g: Tensor, m: Tensor, c: Tensor, *, lr: Scalar, weight_decay: Scalar,
                beta1: Scalar, beta2: Scalar, gscale: Scalar) -> None:
    """One Lion step on matching tensors, in place; ``c`` is scratch of ``m``'s shape and dtype.

    ``gscale`` (``±1/scale``; negative to maximize) multiplies the gradient. It is
    folded into the two scalars that multiply ``g``: ``sign(c)`` would not need it,
    but the momentum does, and this way the gradient is never rescaled in a pass of its own.
    Every scalar may be a 0-d tensor: a compiled step then takes them as inputs,
    so a changing lr (or loss scale) never recompiles it.
    """
    _axpy_(torch.mul(m, beta1, out=c), (1 - beta1) * gscale, g)  # c = b1*m + (1-b1)*g
    if isinstance(weight_decay, Tensor) or weight_decay:
        p.mul_(1 - lr * weight_decay)                             # p = p * (1 - lr*wd)
    _axpy_(p, -lr, c.sign_())                                     # p = p - lr * sign(c)
    _axpy_(m.mul_(beta2), (1 - beta2) * gscale, g)                # m = b2*m + (1-b2)*g


def _axpy_(y: Tensor, a: Scalar, x: Tensor) -> Tensor:
    """``y += a * x`` in place: ``alpha`` takes only numbers, so a 0-d tensor ``a`` multiplies."""
    return y.addcmul_(x, a) if isinstance(a, Tensor) else y.add_(x, alpha=a)


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


def _traced_lion(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], **hp: Any) -> None:
    """:func:`lion_update` per tensor, for tracing under ``torch.compile``: no chunks
    and no scratch (inductor fuses the ops into one loop and drops ``c``)."""
    for p, g, m in zip(params, grads, exp_avgs):
        work = p if p.dtype == m.dtype else p.to(m.dtype)
        lion_update(work, g.to(m.dtype), m, torch.empty_like(m), **hp)
        if work is not p:
            p.copy_(work)


def _foreach_lion(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], *, lr: float | Tensor,
                  weight_decay: float, beta1: float, beta2: float, gscale: float) -> None:
    """:func:`lion_update` as ``torch._foreach_*`` ops, one batch per (device, dtype)."""
    for ps, gs, ms in by_device_and_dtype(params, grads, exp_avgs).values():
        work = [p.to(m.dtype) for p, m in zip(ps, ms)]  # fp32 copies of fp16/bf16 params
        gs = [g.to(m.dtype) for g, m in zip(gs, ms)]
        cs = torch._foreach_mul(ms, beta1)                       # c = b1*m + (1-b1)*g
        torch._foreach_add_(cs, gs, alpha=(1 - beta1) * gscale)
        if weight_decay:
            torch._foreach_mul_(work, 1 - lr * weight_decay)     # p = p * (1 - lr*wd)
        torch._foreach_sign_(cs)                                 # p = p - lr * sign(c)
        if isinstance(lr, Tensor):  # a tensor cannot be an alpha
            torch._foreach_mul_(cs, lr)
            torch._foreach_sub_(work, cs)
        else:
            torch._foreach_add_(work, cs, alpha=-lr)
        torch._foreach_mul_(ms, beta2)                           # m = b2*m + (1-b2)*g
        torch._foreach_add_(ms, gs, alpha=(1 - beta2) * gscale)
        if work[0] is not ps[0]:
            torch._foreach_copy_(ps, work)


_IMPLEMENTATIONS = ("foreach", "fused", "compiled")


def _check_flags(values: dict[str, Any]) -> None:
    chosen = [k for k in _IMPLEMENTATIONS if values.get(k)]
    if len(chosen) > 1:
        raise ConfigError(
            f"Lion: {' and '.join(f'{k}=True' for k in chosen)} ask for {len(chosen)} implementations; "
            "set only one of them.",
            problems=[(k, "conflicts with " + ", ".join(f"{o}=True" for o in chosen if o != k)) for k in chosen],
            target="Lion",
        )


def _keep_tensor_lr(given: dict[str, Any], validated: dict[str, Any]) -> dict[str, Any]:
    """A 0-d tensor ``lr`` stays a tensor (validated as its value): under
    ``torch.compile`` a scheduled tensor lr is an input, a float lr a constant that
    recompiles the step whenever it changes."""
    lr = given.get("lr")
    if isinstance(lr, Tensor):
        if lr.numel() != 1 or lr.is_complex():
            raise ConfigError(f"Lion: a tensor lr must hold one real number; got shape {tuple(lr.shape)}.",
                              problems=[("lr", "tensor lr with more than one element")], target="Lion")
        validated["lr"] = lr
    return validated


def _where(index: int, group: dict[str, Any], i: int, p: Tensor) -> str:
    """How an error names parameter ``i`` of group ``index``: by name where the group has names."""
    names = group.get("param_names")
    name = f"{names[i]!r} " if names and i < len(names) else ""
    return f"parameter {name}(#{i} of param group {index}, shape {tuple(p.shape)})"


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
    sharding: ClassVar[str] = "elementwise"  # each element's update is its own: steps a shard alone
    #: read by optcore when a state_dict loads: exp_avg has the parameter's shape
    state_shapes: ClassVar[str] = "elementwise"
    _step_supports_amp_scaling = True  # read by torch.amp.GradScaler: we unscale and skip ourselves
    #: for optcore.testing: a usable lr, and every parameter dtype Lion steps (fp16/bf16 with fp32 momentum)
    conformance_inputs: ClassVar[dict[str, Any]] = {
        "config": {"lr": 1e-3}, "dtypes": ("float32", "float64", "bfloat16", "float16")
    }

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, maximize: bool = False, foreach: bool | None = None,
                 fused: bool | None = None, compiled: bool | None = None) -> None:
        hparams = dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize, foreach=foreach, fused=fused,
                       compiled=compiled)
        defaults = _keep_tensor_lr(hparams, validate_hparams(self.config_schema, hparams, "Lion"))
        _check_flags(defaults)
        self._scratch: dict[torch.dtype, Tensor] = {}  # chunk buffers of the CPU per-tensor path
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate the group's own hyper-parameters; reject complex parameters up front."""
        group = dict(param_group)
        if not isinstance(group["params"], (Tensor, set)):
            group["params"] = list(group["params"])
        own = {k: v for k, v in group.items() if k in LionConfig.model_fields}
        if own:  # a group of only params (a build's usual case) inherits the validated defaults
            validated = _keep_tensor_lr(own, validate_hparams(self.config_schema, own, "Lion"))
            group.update({k: v for k, v in validated.items() if k in own})
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
            for key in ("maximize", *_IMPLEMENTATIONS):
                group.setdefault(key, self.defaults.get(key, LionConfig.model_fields[key].default))

    def load_state_dict(self, state_dict: dict[str, Any], optimizer_overrides: dict[str, Any] | None = None) -> None:
        """As torch's, except that fp16/bf16 parameters keep their fp32 momentum
        (torch would cast it to the parameter's dtype), and that momentum of
        another shape than its parameter (a checkpoint of another model) is a
        ConfigError naming the parameter, raised before anything is loaded."""
        saved = state_dict["state"]
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] == [len(g["params"]) for g in self.param_groups]:
            for index, (saved_group, group) in enumerate(zip(saved_groups, self.param_groups)):
                for i, (pid, p) in enumerate(zip(saved_group["params"], group["params"])):
                    m = saved.get(pid, {}).get("exp_avg")
                    if isinstance(m, Tensor) and m.shape != p.shape:
                        raise ConfigError(
                            f"Lion cannot load this state: the momentum (exp_avg) saved for {_where(index, group, i, p)} "
                            f"has shape {tuple(m.shape)}. The checkpoint is of another model (or the parameters are "
                            "in another order); load it into the model it was saved from.",
                            problems=[("state", f"exp_avg shape {tuple(m.shape)} != parameter {tuple(p.shape)}")],
                            target="Lion",
                        )
        super().load_state_dict(state_dict, optimizer_overrides)
        for i, p in zip(ids, (p for group in self.param_groups for p in group["params"])):
            if p.dtype in _LOW_PRECISION and i in saved and "exp_avg" in saved[i]:
                self.state[p]["exp_avg"] = saved[i]["exp_avg"].to(device=p.device, dtype=torch.float32)

    def _check(self, index: int, group: dict[str, Any]) -> None:
        """Raise before any update if a gradient or the state of ``group`` cannot be used."""
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            m = self.state[p].get("exp_avg") if p in self.state else None
            if m is not None and m.shape != p.shape:
                raise ConfigError(
                    f"Lion cannot step: the momentum (exp_avg) of {_where(index, group, i, p)} has shape "
                    f"{tuple(m.shape)}; the optimizer state belongs to another model. Load a checkpoint of this model "
                    "(or start with a fresh optimizer).",
                    problems=[("state", f"exp_avg shape {tuple(m.shape)} != parameter {tuple(p.shape)}")],
                    target="Lion",
                )
            problem = None
            if p.grad.is_sparse:
                problem = "is sparse; use nn.Embedding(sparse=False), or torch.optim.SparseAdam for those parameters"
            elif p.is_complex():
                problem = "is complex; optimize torch.view_as_real(p) instead"
            elif group["fused"] and not torch.compiler.is_compiling() and not _cpu_kernel.eligible(p, p.grad):
                problem = "is not a contiguous fp32 CPU tensor, which fused=True needs; set fused=None"
            if problem:
                raise ConfigError(f"Lion cannot step: the gradient of {_where(index, group, i, p)} "
                                  f"({p.dtype}, {p.device}) {problem}.", problems=[("params", problem)], target="Lion")
        if group["fused"] and not torch.compiler.is_compiling() and _cpu_kernel.load() is None:
            raise ConfigError(f"Lion: fused=True, but the C kernel could not be built: "
                              f"{_cpu_kernel.unavailable_reason}. Set fused=None to use the eager path.",
                              problems=[("fused", "kernel unavailable")], target="Lion")

    def _gather(self, group: dict[str, Any]) -> dict[Callable[..., None], tuple[list[Tensor], ...]]:
        """Create missing state and route each (param, grad, momentum) to an implementation."""
        routes: dict[Callable[..., None], tuple[list[Tensor], ...]] = {}
        tracing = torch.compiler.is_compiling()  # the C kernel and the chunked loop are eager-only
        use_kernel = group["fused"] or (group["fused"] is None and group["foreach"] is None and not group["compiled"])
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
            accelerator = p.device.type != "cpu"
            if tracing:
                route = _foreach_lion if group["foreach"] or (group["foreach"] is None and accelerator) else _traced_lion
            elif plain and use_kernel and _cpu_kernel.eligible(p, g, m) and _cpu_kernel.load() is not None:
                route = _cpu_kernel.lion_fp32_
            elif plain and group["compiled"]:
                route = _compiled.compiled_lion
            elif not plain or group["foreach"] or (group["foreach"] is None and accelerator):
                route = _foreach_lion
            else:
                route = self._forloop
            for bucket, t in zip(routes.setdefault(route, ([], [], [])), (p, g, m)):
                bucket.append(t)
        return routes

    def _forloop(self, params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], **hp: Any) -> None:
        _forloop_lion(params, grads, exp_avgs, scratch=self._scratch, **hp)

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
        indices = [next(i for i, g in enumerate(self.param_groups) if g is group) for group in selected]
        for index, group in zip(indices, selected):  # every gradient is checked before anything is updated
            self._check(index, group)
        for group in selected:
            beta1, beta2 = group["betas"]
            hp = dict(lr=group["lr"], weight_decay=group["weight_decay"], beta1=beta1, beta2=beta2,
                      gscale=(-1.0 if group["maximize"] else 1.0) / scale)
            for update, tensors in self._gather(group).items():
                update(*tensors, **hp)
        return loss
