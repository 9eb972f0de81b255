"""Give a ``torch.optim`` or third-party optimizer class the optcore contract.

:func:`adapt` returns a cached subclass ``(ContractMixin, cls)``, importable by
name from this module (``optcore._adapt.AdamW``) so that it pickles like ``cls``.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import threading
from typing import Any

import torch

from ._contract import ContractMixin, param_groups_assignable
from ._torch_facts import (
    PACKAGE_SHARDING,
    PASSES_CLOSURE,
    SHARDING_KINDS,
    SINGLE_GROUP,
    TORCH_FACTS,
    known_lr_schedule,
)
from .guards import check_fused_inputs

_cache: dict[type, type] = {}
_lock = threading.Lock()

CONTRACT_MEMBERS = (
    "get_lr", "set_lr", "get_lrs", "backward", "multiply_grads", "clip_grad_norm", "average_params", "optimizer_config",
)


class _FusedScaleMixin(ContractMixin):
    """For torch classes whose fused kernels take ``grad_scale``: ``step(scale=s)``
    hands ``s`` to the kernel, which divides in the same pass over memory."""

    @property  # type: ignore[override]
    def supports_step_with_scale(self) -> bool:
        return bool(self.param_groups) and all(g.get("fused") for g in self.param_groups)

    def step(self, closure: Any = None, scale: float = 1.0, groups: Any = None) -> Any:  # type: ignore[override]
        """The fused kernels write through their tensors unchecked (a replaced
        ``p.data`` or state tensor corrupts the heap): judged first, after the
        closure made the gradients (:func:`optcore.guards.check_fused_inputs`)."""
        if torch.compiler.is_compiling() or not any(g.get("fused") for g in self.param_groups):
            return super().step(closure, scale, groups)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        check_fused_inputs(self.param_groups, self.state)
        super().step(None, scale, groups)
        return loss

    def _scaled_step(self, scale: float) -> None:
        if scale == 1.0 or not self.supports_step_with_scale:
            return super()._scaled_step(scale)
        device = self.param_groups[0]["params"][0].device
        # set by torch.amp.GradScaler: a tensor, or None after its unscale_ (and deleted by it after the step)
        had, previous = "grad_scale" in vars(self), getattr(self, "grad_scale", None)
        combined = torch.as_tensor(scale, dtype=torch.float32, device=device)  # what fused kernels take
        self.grad_scale = combined if previous is None else combined * previous.to(device)
        try:
            self._base_step(None)
        finally:
            if had:
                self.grad_scale = previous
            else:
                del self.grad_scale


def capabilities(target: type) -> dict[str, bool | str]:
    """The flags of ``target``'s default build: a property (judged per instance)
    counts as its default, and fused-kernel classes are built fused; ``sharding``
    is one of ``SHARDING_KINDS``, else ``"unknown"``."""
    cls = adapt(target)
    defaults = {
        "memory_efficient_fp16": False,
        "step_with_scale": issubclass(cls, _FusedScaleMixin),
        "flat_params": False,
        "groups": True,
    }
    values = {name: inspect.getattr_static(cls, f"supports_{name}", d) for name, d in defaults.items()}
    flags: dict[str, bool | str] = {name: v if isinstance(v, bool) else defaults[name] for name, v in values.items()}
    sharding = inspect.getattr_static(cls, "sharding", "unknown")
    return {**flags, "sharding": sharding if sharding in SHARDING_KINDS else "unknown"}


def _original_step(cls: type, passes_closure: bool) -> Any:
    """Without torch's profiling wrapper. A step that re-evaluates the closure runs
    outside dynamo, as torch's does (traced, it gives other numbers); lazily
    unless dynamo is loaded, so ``optcore list`` never imports it (~1 s)."""
    step = inspect.getattr_static(cls, "step")
    while getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):  # torch's profile_hook_step
        step = step.__wrapped__
    if not passes_closure:
        return step
    if "torch._dynamo" in sys.modules:
        return torch.compiler.disable(step, reason=f"optimizer {cls} step not supported")
    return torch._disable_dynamo(step)


def adapt(cls: type[torch.optim.Optimizer], *, groups: bool | None = None) -> type:
    """Flags of torch classes come from ``_torch_facts``; other classes' are False
    unless declared (D-Adaptation, Prodigy and Adai pool statistics over groups).
    ``groups=`` declares a fact of the class, so it holds for every instance,
    also when the class was adapted before."""
    if issubclass(cls, ContractMixin):
        if groups is None or "adapted_from" not in vars(cls):
            return cls
        cls = cls.adapted_from  # an adapted class: the declaration is about the class it adapts
    with _lock:
        if cls in _cache:
            if groups is not None:
                _cache[cls].supports_groups = bool(groups) and param_groups_assignable(cls)
            return _cache[cls]
        in_torch = cls.__module__.startswith("torch.optim")
        is_torch = in_torch and cls.__name__ in TORCH_FACTS
        pointwise, takes_grad_scale, sharding = TORCH_FACTS[cls.__name__] if is_torch else (False, False, "unknown")
        sharding = PACKAGE_SHARDING.get(f"{cls.__module__.partition('.')[0]}:{cls.__name__}", sharding)
        if groups is None:
            groups = cls.__name__ not in SINGLE_GROUP if is_torch else getattr(cls, "supports_groups", False)
        passes_closure = is_torch and cls.__name__ in PASSES_CLOSURE
        reason = "" if pointwise else (
            f"{cls.__name__}'s update is not known to be pointwise (it may use each parameter's "
            "shape, as factored or orthogonalised updates do), so it must see the parameters one by one"
        )
        namespace: dict[str, Any] = {
            "__module__": __name__,
            "__qualname__": cls.__name__ if in_torch else f"{cls.__module__.replace('.', '_')}__{cls.__name__}",
            "__doc__": cls.__doc__,
            "supports_flat_params": getattr(cls, "supports_flat_params", pointwise),
            "supports_groups": bool(groups) and param_groups_assignable(cls),
            "supports_memory_efficient_fp16": getattr(cls, "supports_memory_efficient_fp16", False),
            # the class's own declaration (a property too), else what optcore knows of it
            "lr_schedule": inspect.getattr_static(cls, "lr_schedule", None) or known_lr_schedule(cls) or "any",
            "sharding": getattr(cls, "sharding", sharding),
            "_passes_closure": passes_closure,
            "flat_params_unsupported_reason": getattr(cls, "flat_params_unsupported_reason", "") or reason,
            # Looked up once here, not per step: torch.compile cannot trace
            # ``super().step.__func__`` (five graph breaks for AdamW).
            "_original_step": staticmethod(_original_step(cls, passes_closure)),
            "adapted_from": cls,
        }
        # A member the class defines for its own use (pytorch_optimizer's AdaFactor
        # has get_lr(lr, step, ...)) keeps its meaning; the contract's is unavailable.
        below = list(itertools.takewhile(lambda k: k not in (torch.optim.Optimizer, object), cls.__mro__))
        conflicts = [m for m in CONTRACT_MEMBERS if any(m in vars(klass) for klass in below)]
        namespace.update({m: inspect.getattr_static(cls, m) for m in conflicts}, contract_conflicts=tuple(conflicts))
        mixin = _FusedScaleMixin if takes_grad_scale else ContractMixin
        adapted = type(cls.__name__, (mixin, cls), namespace)
        _cache[cls] = adapted
        setattr(sys.modules[__name__], adapted.__qualname__, adapted)
        return adapted


def __getattr__(name: str) -> type:
    """Re-create an adapted class on unpickling in a fresh process."""
    if name.startswith("_"):
        raise AttributeError(name)
    if isinstance(vars(torch.optim).get(name), type):
        return adapt(vars(torch.optim)[name])
    module, sep, cls_name = name.rpartition("__")
    first, *rest = module.split("_")
    # ``pkg_sub_mod`` could be ``pkg.sub_mod`` or ``pkg_sub.mod``: try every dotted split
    for seps in itertools.product("_.", repeat=len(rest)) if sep else ():
        candidate = first + "".join(s + part for s, part in zip(reversed(seps), rest))
        try:
            target = getattr(importlib.import_module(candidate), cls_name)
        except (ImportError, AttributeError):
            continue
        return adapt(target)
    raise AttributeError(name)
