"""Give a ``torch.optim`` or third-party optimizer class the optcore contract.

:func:`adapt` returns a subclass ``(ContractMixin, cls)``: the original class's
``__init__`` and ``step`` run unchanged, ``isinstance`` with the original class
holds, and the contract's members come from the mixin. The subclasses are
cached and importable by name from this module (``optcore._adapt.AdamW``), so
an adapted optimizer pickles and deep-copies like the original.
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
from ._torch_facts import PASSES_CLOSURE, SINGLE_GROUP, TORCH_FACTS

_cache: dict[type, type] = {}
_lock = threading.Lock()


class _FusedScaleMixin(ContractMixin):
    """For torch classes whose fused kernels take a ``grad_scale`` input
    (Adam, AdamW, SGD, Adagrad): ``step(scale=s)`` hands ``s`` to the kernel,
    which divides the gradients inside the same pass over memory."""

    @property  # type: ignore[override]
    def supports_step_with_scale(self) -> bool:
        return bool(self.param_groups) and all(g.get("fused") for g in self.param_groups)

    def _scaled_step(self, scale: float) -> None:
        if scale == 1.0 or not self.supports_step_with_scale:
            return super()._scaled_step(scale)
        device = self.param_groups[0]["params"][0].device
        previous = getattr(self, "grad_scale", None)  # set by torch.amp.GradScaler
        combined = torch.as_tensor(scale, dtype=torch.float32, device=device)  # what fused kernels take
        self.grad_scale = combined if previous is None else combined * previous.to(device)
        try:
            self._base_step(None)
        finally:
            if previous is None:
                del self.grad_scale
            else:
                self.grad_scale = previous


def _class_flags(
    cls: type, flat_params: bool | None, groups: bool | None, memory_efficient_fp16: bool
) -> dict[str, Any]:
    """The capability attributes of the adapted ``cls``: what is *true* of it.

    For torch classes they come from optcore's table; other classes default to
    False (no flat params, no memory-efficient fp16, no group selection: D-Adaptation,
    Prodigy and Adai pool statistics over all groups) unless the class declares
    them. A read-only ``param_groups`` (wrappers) rules out group selection.
    """
    is_torch = cls.__module__.startswith("torch.optim") and cls.__name__ in TORCH_FACTS
    pointwise, takes_grad_scale = TORCH_FACTS[cls.__name__] if is_torch else (False, False)
    flat = getattr(cls, "supports_flat_params", pointwise) if flat_params is None else flat_params
    if groups is None:
        groups = cls.__name__ not in SINGLE_GROUP if is_torch else getattr(cls, "supports_groups", False)
    reason = getattr(cls, "flat_params_unsupported_reason", "") or (
        ""
        if (pointwise if flat_params is None else flat_params)
        else f"{cls.__name__}'s update is not known to be pointwise (it may use each parameter's "
        "shape, as factored or orthogonalised updates do), so it must see the parameters one by one"
    )
    return {
        "supports_flat_params": flat,
        "supports_groups": bool(groups) and param_groups_assignable(cls),
        "supports_memory_efficient_fp16": getattr(cls, "supports_memory_efficient_fp16", memory_efficient_fp16),
        "_passes_closure": is_torch and cls.__name__ in PASSES_CLOSURE,
        "flat_params_unsupported_reason": reason,
        "_takes_grad_scale": takes_grad_scale,
    }


def capabilities(target: type) -> dict[str, bool]:
    """The contract's four capability flags of ``target``, as true of its default
    build (the one place they are computed: :func:`adapt` sets them on the class,
    ``OptimizerSpec.capabilities`` reports them). ``step_with_scale`` is true of
    torch classes whose default (fused) kernel takes ``grad_scale``, and of
    classes that declare it as a plain ``True``."""
    cls = adapt(target)

    def flag(name: str, default: bool) -> bool:
        value = inspect.getattr_static(cls, name, default)
        return value if isinstance(value, bool) else default  # a property: judged per instance

    return {
        "memory_efficient_fp16": flag("supports_memory_efficient_fp16", False),
        "step_with_scale": issubclass(cls, _FusedScaleMixin) or flag("supports_step_with_scale", False),
        "flat_params": flag("supports_flat_params", False),
        "groups": flag("supports_groups", True),
    }


def _original_step(cls: type, passes_closure: bool) -> Any:
    """The class's own ``step`` without torch's profiling wrapper. torch runs the
    steps that re-evaluate a closure (LBFGS) outside dynamo; so does the adapter,
    or a compiled step would trace into the closure and give other numbers.

    Built eagerly only when dynamo is already imported, with the reason dynamo
    gives for torch's own LBFGS.step; otherwise through ``torch._disable_dynamo``,
    torch's lazy form of the same (what ``torch.optim`` uses), which imports
    dynamo (~1 s) on the step's first call, so ``optcore list`` never pays for it."""
    step = inspect.getattr_static(cls, "step")
    while getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):  # torch's profile_hook_step
        step = step.__wrapped__
    if not passes_closure:
        return step
    if "torch._dynamo" in sys.modules:
        return torch.compiler.disable(step, reason=f"optimizer {cls} step not supported")
    return torch._disable_dynamo(step)


def adapt(
    cls: type[torch.optim.Optimizer],
    *,
    flat_params: bool | None = None,
    groups: bool | None = None,
    memory_efficient_fp16: bool = False,
) -> type:
    """The contract-carrying subclass of ``cls`` (cached per class), with the
    capability flags :func:`_class_flags` finds true of it."""
    if issubclass(cls, ContractMixin):
        return cls
    with _lock:
        cached = _cache.get(cls)
        if cached is not None:
            return cached
        flags = _class_flags(cls, flat_params, groups, memory_efficient_fp16)
        mixin: type = _FusedScaleMixin if flags.pop("_takes_grad_scale") else ContractMixin
        namespace: dict[str, Any] = {
            "__module__": __name__,
            "__qualname__": _public_name(cls),
            "__doc__": cls.__doc__,
            **flags,
            # Looked up once here, not per step: torch.compile cannot trace
            # ``super().step.__func__`` (five graph breaks for AdamW).
            "_original_step": staticmethod(_original_step(cls, flags.get("_passes_closure", False))),
            "adapted_from": cls,
        }
        # A member the class already defines for its own use (pytorch_optimizer's
        # AdaFactor has get_lr(lr, step, ...)) keeps the class's meaning: its
        # step calls it. The contract member is then unavailable, and says so.
        conflicts = [m for m in CONTRACT_MEMBERS if _defined_below_torch(cls, m)]
        for member in conflicts:
            namespace[member] = inspect.getattr_static(cls, member)
        namespace["contract_conflicts"] = tuple(conflicts)
        adapted = type(cls.__name__, (mixin, cls), namespace)
        _cache[cls] = adapted
        setattr(sys.modules[__name__], adapted.__qualname__, adapted)
        return adapted


CONTRACT_MEMBERS = (
    "get_lr", "set_lr", "get_lrs", "backward", "multiply_grads", "clip_grad_norm", "average_params", "optimizer_config",
)


def _defined_below_torch(cls: type, member: str) -> bool:
    below = itertools.takewhile(lambda k: k not in (torch.optim.Optimizer, object), cls.__mro__)
    return any(member in vars(klass) for klass in below)


def _public_name(cls: type) -> str:
    if cls.__module__.startswith("torch.optim"):
        return cls.__name__
    return f"{cls.__module__.replace('.', '_')}__{cls.__name__}"


def __getattr__(name: str) -> type:
    """Re-create an adapted class on unpickling in a fresh process."""
    if name.startswith("_"):
        raise AttributeError(name)
    if name in torch.optim.__dict__ and isinstance(torch.optim.__dict__[name], type):
        return adapt(torch.optim.__dict__[name])
    module, sep, cls_name = name.rpartition("__")
    for candidate in _module_candidates(module) if sep else ():
        try:
            target = getattr(importlib.import_module(candidate), cls_name)
        except (ImportError, AttributeError):
            continue
        return adapt(target)
    raise AttributeError(name)


def _module_candidates(mangled: str) -> list[str]:
    """``pkg_sub_mod`` could be ``pkg.sub_mod`` or ``pkg_sub.mod``: every dotted split."""
    first, *rest = mangled.split("_")
    seps = (reversed(seps) for seps in itertools.product("_.", repeat=len(rest)))
    splits = (first + "".join(s + p for s, p in zip(sep, rest)) for sep in seps)
    return [m for m in splits if m and not m.startswith(".")]
