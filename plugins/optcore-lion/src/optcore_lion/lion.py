"""The Lion optimizer (Chen et al. 2023) in torch's order: the hyper-parameters'
schema, then the class (validate in ``__init__``, ``defaults``, ``step`` gathers
the tensors and calls the update, :func:`optcore_lion.functional.lion`).

What optcore's contract adds to lion-pytorch's class: a pydantic schema
(``ConfigError``s naming the field, from a config or a direct call), the
capability flags other components read, the contract's step preamble
(closure, GradScaler, ``scale``, ``groups``, the checks: ``StepError``s), and
``conformance_inputs`` for optcore's conformance kit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from optcore import ConfigError, StepError
from optcore.plugin import (
    LR, Betas, Flag, HParams, OptionalFlag, Optimizer, WeightDecay, prepare_step, validate_hparams,
)
from pydantic import Field
from torch import Tensor

from . import _cpu_kernel
from .functional import lion, unaliased

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class LionConfig(HParams):
    """Hyper-parameters of :class:`Lion`; the defaults are the paper's."""

    lr: LR = Field(1e-4, description="learning rate; each coordinate moves by lr per step: ~3-10x less than AdamW's")
    betas: Betas = Field((0.9, 0.99), description="(beta1, beta2): beta1 mixes momentum and gradient into the "
                         "update, beta2 decays the momentum")
    weight_decay: WeightDecay = Field(0.0, description="decoupled weight decay (p *= 1 - lr*wd); use ~3-10x AdamW's")
    maximize: Flag = Field(False, description="maximize the objective instead of minimizing it")
    foreach: OptionalFlag = Field(None, description="True: torch._foreach_* ops per (device, dtype); False: cache-"
                                  "sized pieces; None: foreach on accelerators")
    fused: OptionalFlag = Field(None, description="True: the one-pass C kernel (fp32 CPU tensors only); None: use "
                                "it where it applies; False: never")
    compiled: OptionalFlag = Field(None, description="True: lion_update compiled with torch.compile, once per "
                                   "(device, dtype, shapes class); None or False: not (the first step compiles "
                                   "for seconds)")


_BACKENDS = ("foreach", "fused", "compiled")


def _check_flags(values: dict[str, Any]) -> None:
    chosen = [k for k in _BACKENDS if values.get(k)]
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
    #: read by optcore's plan: fused=True over FSDP2's DTensors runs the C kernel on each rank's local shards
    fused_steps_local_shards: ClassVar[bool] = True
    @staticmethod
    def state_shapes(group: dict[str, Any], p: Tensor) -> dict[str, tuple[int, ...]]:
        """The state a stepped parameter keeps, read by optcore when a state_dict
        loads and by every step: the momentum, of the parameter's shape."""
        return {"exp_avg": tuple(p.shape)}

    _step_supports_amp_scaling = True  # read by torch.amp.GradScaler: we unscale and skip ourselves
    #: for optcore.testing: a usable lr, and every parameter dtype Lion steps (fp16/bf16 with fp32 momentum)
    conformance_inputs: ClassVar[dict[str, Any]] = {
        "config": {"lr": 1e-3}, "dtypes": ("float32", "float64", "bfloat16", "float16"), "step_errors": True,
    }

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, maximize: bool = False, foreach: bool | None = None,
                 fused: bool | None = None, compiled: bool | None = None) -> None:
        hparams = dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize, foreach=foreach, fused=fused,
                       compiled=compiled)
        defaults = _keep_tensor_lr(hparams, validate_hparams(self.config_schema, hparams, "Lion"))
        _check_flags(defaults)
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
        for group in self.param_groups:
            for key in ("maximize", *_BACKENDS):
                group.setdefault(key, self.defaults.get(key, LionConfig.model_fields[key].default))

    def load_state_dict(self, state_dict: dict[str, Any], optimizer_overrides: dict[str, Any] | None = None) -> None:
        """As the contract's (which judges the state by :meth:`state_shapes` before
        anything loads), except that fp16/bf16 parameters keep their fp32 momentum
        (torch would cast it to the parameter's dtype)."""
        super().load_state_dict(state_dict, optimizer_overrides)
        saved = state_dict["state"]
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        for i, p in zip(ids, (p for group in self.param_groups for p in group["params"])):
            if p.dtype in _LOW_PRECISION and isinstance(saved.get(i, {}).get("exp_avg"), Tensor):
                self.state[p]["exp_avg"] = saved[i]["exp_avg"].to(device=p.device, dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, scale: float = 1.0,
             groups: Any = None) -> float | None:
        """One update of the selected ``groups`` (all by default), gradients taken as divided by ``scale``."""
        prepared = prepare_step(self, closure, scale, groups, state_kind="floating")  # the contract's checks: nothing changed yet
        if prepared.skip:
            return prepared.loss
        if not torch.compiler.is_compiling():  # the kernel runs eagerly only
            self._check_fused(prepared.params())
        for _, group in prepared.groups:
            params, grads, exp_avgs = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:  # fp32 momentum for fp16/bf16 params
                    dtype = torch.float32 if p.dtype in _LOW_PRECISION else p.dtype
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
            beta1, beta2 = group["betas"]
            lion(params, grads, exp_avgs, lr=group["lr"], weight_decay=group["weight_decay"], beta1=beta1,
                 beta2=beta2, gscale=(-1.0 if group["maximize"] else 1.0) / prepared.scale,
                 foreach=group["foreach"], fused=group["fused"], compiled=group["compiled"])
        return prepared.loss

    @staticmethod
    def _check_fused(params: Iterable[tuple[int, dict[str, Any], int, Tensor]]) -> None:
        """``fused=True`` promises the C kernel: a tensor it cannot take, or no kernel, is refused
        (a DTensor's local shard is taken when :func:`~optcore_lion._cpu_kernel.shard_problem` passes)."""
        for index, group, i, p in params:
            if not group["fused"]:
                continue
            if _cpu_kernel.load() is None:
                raise StepError(f"Lion: fused=True, but the C kernel could not be built: "
                                f"{_cpu_kernel.unavailable_reason}. Set fused=None to use torch ops.")
            problem = _cpu_kernel.shard_problem(p, p.grad)
            if problem is not None:
                raise StepError(f"Lion cannot step {_where(index, group, i, p)} with fused=True: {problem}; "
                                "set fused=None (torch ops step any placement).",
                                param=_where(index, group, i, p))
            local = _cpu_kernel.local_shards(p, unaliased(p, p.grad))  # as lion() will step it
            problem = "its shards are not plain tensors" if local is None else _cpu_kernel.problem(*local)
            if problem is not None:
                raise StepError(f"Lion cannot step {_where(index, group, i, p)} ({p.dtype}, {p.device}) with "
                                f"fused=True: {problem}. The C kernel takes contiguous fp32 CPU tensors that share "
                                "no memory; set fused=None (torch ops step any tensor).",
                                param=_where(index, group, i, p))
