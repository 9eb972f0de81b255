"""The optimizer contract (API.md): capability flags, learning rate and gradient
members, and ``step(closure, scale, groups)``; the checkpoint members are in
:mod:`._checkpoint`, ``average_params`` in :mod:`._averaging`.

Two roads lead here. Optimizers written for optcore subclass :class:`Optimizer`
and implement ``step`` natively. ``torch.optim`` and third-party classes are
*adapted* (:mod:`._adapt`): a subclass mixes :class:`ContractMixin` in front of
the original class, so ``isinstance(opt, torch.optim.AdamW)`` still holds, the
original ``step`` runs unchanged, and the adapter costs one Python call per step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from ._averaging import AveragingMixin
from ._checkpoint import CheckpointMixin
from ._errors import ConfigError
from ._grads import by_device_and_dtype, params_with_grad, total_grad_norm

GroupSelector = Sequence[int | str] | int | str | None

#: Keys of a param group that are bookkeeping, not hyper-parameters.
_NON_HPARAM_KEYS = frozenset({"params", "param_names", "name", "lr_scale"})


class ContractMixin(CheckpointMixin, AveragingMixin):
    """The members API.md promises, on top of ``torch.optim.Optimizer``.

    Capability flags are class attributes that subclasses (or :func:`adapt`)
    set to what is *true* of them; wrappers such as the FP16 optimizers read
    them to pick a strategy.
    """

    #: step works on fp16/bf16 params, computing in fp32 and keeping fp32 state.
    supports_memory_efficient_fp16: ClassVar[bool] = False
    #: ``step(scale=s)`` folds ``1/s`` into the update: no separate unscale pass.
    supports_step_with_scale: bool = False
    #: works on one flat contiguous parameter (pointwise update).
    supports_flat_params: ClassVar[bool] = False
    #: ``step(groups=...)`` steps only the selected groups.
    supports_groups: ClassVar[bool] = True
    #: Why a flat parameter does not work, for wrappers to show (empty when it does).
    flat_params_unsupported_reason: ClassVar[str] = ""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    state: Any

    # ------------------------------------------------------------------ config
    @property
    def optimizer_config(self) -> dict[str, Any]:
        """The effective hyper-parameters: the defaults, with the first group's
        current values on top (so a scheduler-set ``lr`` is what is reported)."""
        config = dict(self.defaults)
        if self.param_groups:
            for key, value in self.param_groups[0].items():
                if key not in _NON_HPARAM_KEYS:
                    config[key] = value
            config["lr"] = self.get_lr()
        return config

    def get_lr(self) -> float | Tensor:
        """The base learning rate: the first group's ``lr`` divided by its
        ``lr_scale`` (1 unless layer-wise scaling is configured), so that
        ``set_lr(get_lr())`` changes nothing. A tensor ``lr`` (the
        torch.compile + LR-scheduler recipe) comes back as a tensor (a copy)."""
        group = self.param_groups[0]
        lr, scale = group["lr"], group.get("lr_scale", 1.0)
        if isinstance(lr, Tensor):
            return lr.detach().clone() if scale == 1.0 else lr.detach() / scale
        return float(lr) / float(scale)

    def get_lrs(self) -> list[float | Tensor]:
        """The learning rate of every group, as stored (``lr_scale`` applied;
        tensors stay tensors)."""
        return [g["lr"] if isinstance(g["lr"], Tensor) else float(g["lr"]) for g in self.param_groups]

    def set_lr(self, lr: float | Tensor | Sequence[float | Tensor]) -> None:
        """Set the learning rate: one number (or 0-dim tensor) sets every group
        to ``lr * group['lr_scale']`` (keeping layer-wise ratios); a sequence
        gives each group its own value. A group whose ``lr`` is a tensor keeps
        that tensor and is filled in place (compiled steps see no new value)."""
        if isinstance(lr, (int, float)) or (isinstance(lr, Tensor) and lr.ndim == 0):
            values = [lr * g.get("lr_scale", 1.0) for g in self.param_groups]
        else:
            values = list(lr)
            if len(values) != len(self.param_groups):
                raise ConfigError(
                    f"set_lr got {len(values)} learning rates for {len(self.param_groups)} param groups; "
                    "pass one number, or one per group."
                )
        for group, value in zip(self.param_groups, values):
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(value.detach() if isinstance(value, Tensor) else value)
            else:
                group["lr"] = float(value)

    # --------------------------------------------------------------- gradients
    def backward(self, loss: Tensor) -> None:
        """``loss.backward()``; precision wrappers scale the loss here."""
        loss.backward()

    def multiply_grads(self, c: float | Tensor) -> None:
        """Multiply every gradient by ``c`` in place, one fused call per device and dtype."""
        if not isinstance(c, Tensor) and c == 1.0:
            return
        for (device, _), grads in by_device_and_dtype(
            p.grad for p in params_with_grad(self.param_groups)
        ).items():
            factor = c.to(device) if isinstance(c, Tensor) else c
            torch._foreach_mul_(grads, factor)

    def clip_grad_norm(
        self,
        max_norm: float,
        aggregate_norm_fn: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """Return the total 2-norm of all gradients and, if ``max_norm > 0``,
        scale them so it is at most ``max_norm``.

        ``aggregate_norm_fn`` combines per-shard norms (model parallelism) before
        clipping. A non-finite norm is returned without touching the gradients,
        so the caller (or a loss scaler) can skip the step.
        """
        grads = [p.grad for p in params_with_grad(self.param_groups)]
        if not grads:
            return torch.zeros(())
        total = total_grad_norm(grads)
        if aggregate_norm_fn is not None:
            total = aggregate_norm_fn(total)
        if max_norm > 0 and bool(torch.isfinite(total)):
            coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
            self.multiply_grads(coef)
        return total

    # -------------------------------------------------------------------- step
    def _select_groups(self, groups: GroupSelector) -> list[dict[str, Any]]:
        """The param groups named by ``groups``: indices, or the ``name`` given
        to a group in the config; ``None`` selects all."""
        if groups is None:
            return list(self.param_groups)
        names, count = [g.get("name") for g in self.param_groups], len(self.param_groups)
        selected: list[dict[str, Any]] = []
        for key in [groups] if isinstance(groups, (int, str)) else groups:
            index = names.index(key) if isinstance(key, str) and key in names else key
            if isinstance(index, bool) or not isinstance(index, int) or not -count <= index < count:
                known = [n for n in names if n is not None]
                raise ConfigError(
                    f"step(groups=...) names unknown group {key!r}; groups are selected by "
                    f"index (0..{count - 1}) or by name ({known or 'none named'})."
                )
            if all(self.param_groups[index] is not g for g in selected):
                selected.append(self.param_groups[index])
        return selected

    #: Classes whose ``step`` must call the closure itself (LBFGS re-evaluates it).
    _passes_closure: ClassVar[bool] = False
    #: The adapted class's own ``step``, without torch's profiling wrapper (set by
    #: :func:`optcore._adapt.adapt`; a plain attribute so torch.compile traces it).
    _original_step: ClassVar[Callable[..., Any] | None] = None

    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        """One update with gradients divided by ``scale``, restricted to ``groups``.

        The adapted class's own ``step`` does the work, after the closure (so
        ``scale`` applies to the gradients it produced). A plain ``step()`` is
        that step and nothing else: one call, so torch.compile sees the graph
        breaks torch's optimizer has, and no more.
        """
        original = self._original_step
        if scale == 1.0 and groups is None and original is not None and (closure is None or self._passes_closure):
            return original(self, closure)
        return self._contract_step(closure, scale, groups)

    def _contract_step(self, closure: Callable[[], float] | None, scale: float, groups: GroupSelector) -> float | None:
        if self._passes_closure:
            if scale != 1.0 or groups is not None:
                raise ConfigError(
                    f"{type(self).__name__} re-evaluates the closure inside step, so it cannot take "
                    "scale= or groups=; unscale the loss in the closure instead."
                )
            return self._base_step(closure)
        if groups is not None:
            self._check_groups_supported()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if groups is None:
            self._scaled_step(scale)
            return loss
        saved_groups = self.param_groups
        self.param_groups = self._select_groups(groups)
        try:
            self._scaled_step(scale)
        finally:
            self.param_groups = saved_groups
        return loss

    def _check_groups_supported(self) -> None:
        assignable = param_groups_assignable(type(self))
        if self.supports_groups and assignable:
            return
        if not assignable:
            why = (
                "its param_groups is a read-only property (it wraps another optimizer or derives its groups), "
                "so optcore cannot restrict a step to some of them"
            )
        else:
            why = "its update may couple param groups (or optcore cannot vouch that it does not)"
        raise ConfigError(
            f"{type(self).__name__} does not support step(groups=...): {why}. Step all groups, or use an "
            "optimizer whose supports_groups is True."
        )

    def _scaled_step(self, scale: float) -> None:
        """The class's step on gradients divided by ``scale``: one multiply over
        them first (adapted classes whose fused kernels take ``grad_scale`` fold it in)."""
        if scale != 1.0:
            self.multiply_grads(1.0 / scale)
        self._base_step(None)

    def _base_step(self, closure: Callable[[], float] | None) -> float | None:
        """The adapted class's own ``step``, without torch's profiling wrapper
        (our class already carries one; running the step hooks twice would be a bug)."""
        original = self._original_step
        if original is None:  # a ContractMixin subclass not made by adapt()
            return super().step(closure)  # type: ignore[misc]
        return original(self, closure)


def param_groups_assignable(cls: type) -> bool:
    """False where ``param_groups`` is a read-only property (wrappers such as
    Lookahead or ScheduleFreeWrapper expose their inner optimizer's groups)."""
    attr = inspect.getattr_static(cls, "param_groups", None)
    return not (isinstance(attr, property) and attr.fset is None)


class Optimizer(ContractMixin, torch.optim.Optimizer):
    """Base class for optimizers written for optcore.

    Subclasses implement ``step(closure=None, scale=1.0, groups=None)``
    natively (use :meth:`_select_groups` and fold ``1/scale`` into the update),
    set the capability flags that are true of them, and may attach a pydantic
    ``config_schema``.
    """

    config_schema: ClassVar[Any] = None

    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        raise NotImplementedError(f"{type(self).__name__} must implement step(closure, scale, groups)")

