"""The optimizer contract through accelerate's ``AcceleratedOptimizer``.

``Accelerator.prepare`` (and the Hugging Face Trainer, which calls it) hands
back an ``AcceleratedOptimizer`` that forwards ``step``, ``zero_grad`` and the
state dicts, and hides the rest of the contract (``get_lr``,
``clip_grad_norm``, ``step(scale=)``, ``load_state_dict(optimizer_overrides=)``,
the capability flags). :func:`with_contract` gives that same wrapper the
contract::

    model, optimizer = optcore.integrations.accelerate.prepare(accelerator, model, optimizer)
    optimizer.clip_grad_norm(1.0); optimizer.step(scale=world_size)

The wrapper keeps its identity: accelerate's list of optimizers, its
``GradScaler`` hook (a closure over the wrapper) and the Trainer's
``trainer.optimizer`` all hold the object it was, so :func:`with_contract`
changes its class in place to a subclass of its own class with the contract
in front, instead of making a new wrapper. accelerate's step rules stay: no
step while gradients accumulate (``sync_gradients`` false), and under a
``GradScaler`` the scaler unscales (or skips a step on ``inf``) before
``step(scale=)`` divides by ``scale``. ``clip_grad_norm`` unscales first, as
``Accelerator.clip_grad_norm_`` does.

accelerate is imported only when a wrapper is given the contract.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from .._errors import ConfigError, StepError
from .unwrap import unwrap

__all__ = ["ContractForwarding", "prepare", "with_contract"]

#: Contract members that read the same through the wrapper as on the optimizer inside.
_FORWARDED_FACTS = (
    "supports_memory_efficient_fp16",
    "supports_step_with_scale",
    "supports_flat_params",
    "supports_groups",
    "sharding",
    "lr_schedule",
    "optimizer_config",
)


def _forwarded(name: str) -> property:
    return property(lambda self: getattr(unwrap(self.optimizer), name), doc=f"The optimizer inside's ``{name}``.")


class ContractForwarding:
    """Mixed in front of an ``AcceleratedOptimizer`` class by :func:`with_contract`:
    the contract of the optcore optimizer inside, with accelerate's step rules."""

    optimizer: Any
    scaler: Any
    gradient_state: Any
    _contract_base: type

    def get_lr(self) -> Any:
        return unwrap(self.optimizer).get_lr()

    def get_lrs(self) -> list[Any]:
        return unwrap(self.optimizer).get_lrs()

    def set_lr(self, lr: Any) -> None:
        unwrap(self.optimizer).set_lr(lr)

    def multiply_grads(self, c: Any) -> None:
        unwrap(self.optimizer).multiply_grads(c)

    def average_params(self, group: Any = None) -> None:
        unwrap(self.optimizer).average_params(group)

    def backward(self, loss: torch.Tensor) -> None:
        """The contract's backward of ``loss`` as given, scaled by accelerate's
        ``GradScaler`` when it has one (its step unscales what it scaled).
        ``accelerator.backward(loss)`` also divides by the accumulation steps."""
        if self._scaling():
            loss = self.scaler.scale(loss)
        unwrap(self.optimizer).backward(loss)

    def clip_grad_norm(self, max_norm: float, aggregate_norm_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """The norm of the unscaled gradients: under a ``GradScaler`` they are
        unscaled first (once per step), as ``Accelerator.clip_grad_norm_`` does."""
        if self._scaling() and _stage(self.scaler, self.optimizer) != "UNSCALED":
            if not self.gradient_state.sync_gradients:
                raise StepError(
                    "clip_grad_norm while gradients accumulate (accelerator.sync_gradients is false): the GradScaler "
                    "would unscale a partial sum, and the next micro-batch would add scaled gradients to it. Clip "
                    "at the step that syncs: under `if accelerator.sync_gradients:`."
                )
            self.scaler.unscale_(self.optimizer)
        return unwrap(self.optimizer).clip_grad_norm(max_norm, aggregate_norm_fn)

    def step(self, closure: Callable[[], float] | None = None, scale: Any = 1.0, groups: Any = None) -> Any:
        """accelerate's step (skipped while gradients accumulate; through the
        ``GradScaler`` when there is one), with ``scale`` and ``groups`` passed
        to the optcore optimizer's step."""
        extra = {k: v for k, v in (("scale", scale), ("groups", groups)) if not _is_default(k, v)}
        if not extra:
            return super().step(closure)  # type: ignore[misc]
        with self._stepping_with(extra):
            return super().step(closure)  # type: ignore[misc]

    def load_state_dict(self, state_dict: Mapping[str, Any], optimizer_overrides: Mapping[str, Any] | None = None) -> None:
        """accelerate's load (device placement on XLA), with ``optimizer_overrides``."""
        if optimizer_overrides is None:
            return super().load_state_dict(state_dict)  # type: ignore[misc]
        with _bound(self.optimizer, "load_state_dict", optimizer_overrides=optimizer_overrides):
            return super().load_state_dict(state_dict)  # type: ignore[misc]

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled as accelerate's wrapper and given the contract again when loaded."""
        return _restore, (self._contract_base, self.__getstate__())  # type: ignore[attr-defined]

    def _scaling(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()

    @contextmanager
    def _stepping_with(self, extra: dict[str, Any]) -> Iterator[None]:
        """accelerate calls ``self.optimizer.step(closure)``, or, with a scaler, the
        step it patched in at construction: both get ``extra`` for this one call."""
        if self.scaler is None:
            with _bound(self.optimizer, "step", **extra):
                yield
            return
        from accelerate.optimizer import patch_optimizer_step

        patched = self._optimizer_patched_step_method  # type: ignore[has-type]
        self._optimizer_patched_step_method = patch_optimizer_step(
            self, functools.partial(self._optimizer_original_step_method, **extra)  # type: ignore[has-type]
        )
        try:
            yield
        finally:
            self._optimizer_patched_step_method = patched


for _name in _FORWARDED_FACTS:
    setattr(ContractForwarding, _name, _forwarded(_name))


def _is_default(key: str, value: Any) -> bool:
    if key == "groups":
        return value is None
    return not isinstance(value, torch.Tensor) and value == 1.0


@contextmanager
def _bound(obj: Any, method: str, **kwargs: Any) -> Iterator[None]:
    """``obj.<method>`` with ``kwargs`` bound, for the duration; an instance
    attribute it had (an LR scheduler's step counter) is put back after."""
    own = vars(obj)
    had, previous = method in own, own.get(method)
    setattr(obj, method, functools.partial(getattr(obj, method), **kwargs))
    try:
        yield
    finally:
        if had:
            setattr(obj, method, previous)
        else:
            delattr(obj, method)


def _stage(scaler: Any, optimizer: Any) -> str:
    """The ``GradScaler``'s stage for ``optimizer`` (READY, UNSCALED or STEPPED)."""
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, Mapping) or id(optimizer) not in states:
        return "READY"
    return getattr(states[id(optimizer)].get("stage"), "name", "READY")


@functools.cache
def _with_contract_class(base: type) -> type:
    cls = type(f"{base.__name__}WithContract", (ContractForwarding, base), {"_contract_base": base})
    cls.__module__ = __name__
    return cls


def with_contract(optimizer: Any) -> Any:
    """``optimizer`` with the contract: accelerate's ``AcceleratedOptimizer``
    (any subclass) around an optcore optimizer, changed in place, or an optcore
    optimizer itself. Raises :class:`~optcore.ConfigError` for a wrapper with
    no optcore optimizer inside, or another kind of object."""
    from accelerate.optimizer import AcceleratedOptimizer

    if isinstance(optimizer, ContractForwarding):
        return optimizer
    if not isinstance(optimizer, AcceleratedOptimizer):
        inner = unwrap(optimizer)  # a ConfigError when there is no optcore optimizer in it
        if inner is optimizer:
            return optimizer
        raise ConfigError(
            f"with_contract gives accelerate's AcceleratedOptimizer the contract; {type(optimizer).__name__} is "
            "another wrapper: call optcore.unwrap() on it for the optcore optimizer inside."
        )
    unwrap(optimizer)  # refuse before changing anything
    optimizer.__class__ = _with_contract_class(type(optimizer))
    if getattr(vars(optimizer).get("step"), "_wrapped_by_lr_sched", False):
        optimizer.step = _counted_step(optimizer)
    return optimizer


def _counted_step(wrapper: Any) -> Callable[..., Any]:
    """An LR scheduler made before :func:`with_contract` (the Trainer's, on the
    ``optimizer_cls_and_kwargs`` road) replaced the wrapper's ``step`` by one
    that notes the call for its order check and then runs accelerate's class's
    step: this one notes it the same way and runs the contract's."""
    owner = weakref.ref(wrapper)

    @functools.wraps(type(wrapper).step)
    def step(*args: Any, **kwargs: Any) -> Any:
        opt = owner()
        opt._opt_called = True  # what torch's LRScheduler reads to warn about the call order
        return type(opt).step(opt, *args, **kwargs)

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    return step


def _restore(base: type, state: dict[str, Any]) -> Any:
    wrapper = base.__new__(base)
    wrapper.__setstate__(state)
    return with_contract(wrapper)


def prepare(accelerator: Any, *objects: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare(*objects, **kwargs)``, each optcore optimizer in the
    result given the contract (:func:`with_contract`); other objects as accelerate
    returns them."""
    from accelerate.optimizer import AcceleratedOptimizer

    prepared = accelerator.prepare(*objects, **kwargs)
    many = isinstance(prepared, tuple)
    out = [
        with_contract(obj) if isinstance(obj, AcceleratedOptimizer) and _holds_optcore(obj) else obj
        for obj in (prepared if many else (prepared,))
    ]
    return tuple(out) if many else out[0]


def _holds_optcore(wrapper: Any) -> bool:
    try:
        unwrap(wrapper.optimizer)
    except ConfigError:
        return False
    return True
