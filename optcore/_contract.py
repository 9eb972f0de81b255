"""The optimizer contract (API.md, docs/contract.md).

Native optimizers subclass :class:`Optimizer`; :mod:`._adapt` mixes
:class:`ContractMixin` in front of torch and third-party classes. A state dict
records its saver and the shapes of the parameters with state, which are
checked before loading; :mod:`optcore.placement` keeps these records through
DCP and takes norms and averages over ranks.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from ._errors import ConfigError, StepError
from ._values import clean_text
from .grads import multiply, params_with_grad
from .guards import check_state_dict
from .placement import _dcp, check_dcp_layout
from .placement import install as install_first_step_checks
from .placement._ranks import average_optimizer, clip_by_norm

GroupSelector = Sequence[int | str] | int | str | None

#: The values of the contract's ``lr_schedule``: what the optimizer does with the
#: group ``lr``, which LR schedulers read. ``"any"``: it is the step size, and any
#: schedule applies; ``"constant"``: schedule-free (iterate averaging replaces the
#: decay), so warm-up and constant schedules only; ``"none"``: the optimizer
#: computes its own step size and no schedule has an effect.
LR_SCHEDULES = ("any", "constant", "none")

_NON_HPARAM_KEYS = frozenset({"params", "param_names", "name", "lr_scale", "optimizer"})


class ContractMixin:
    """The flags say what is *true* of the class; wrappers read them to pick a strategy."""

    supports_memory_efficient_fp16: ClassVar[bool] = False
    supports_step_with_scale: bool = False  # not a ClassVar: _adapt makes it a property
    supports_flat_params: ClassVar[bool] = False
    supports_groups: ClassVar[bool] = True
    sharding: ClassVar[str] = "unknown"  # how the update couples elements: _torch_facts.SHARDING_KINDS
    flat_params_unsupported_reason: ClassVar[str] = ""
    lr_schedule: str = "any"  # one of LR_SCHEDULES; not a ClassVar: a property may judge the groups
    #: the process group over whose ranks this optimizer's parameters are split
    #: (ZeRO's shards): the gradient norm is taken over all of them
    shard_group: Any = None

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    state: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every instance gets the first-step checks of :mod:`optcore.placement`
        (DCP's initialisation step, a ``global`` optimizer on sharded
        parameters) when its ``__init__`` returns (its signature kept)."""
        super().__init_subclass__(**kwargs)
        init = vars(cls).get("__init__", cls.__init__)
        if not hasattr(init, "__optcore_carried__") and init is not object.__init__:
            cls.__init__ = _installing(init)  # type: ignore[misc]
        _dcp.carry(cls)  # a subclass's own entries (AdaScale's estimates) travel in the first group's record too

    @property
    def optimizer_config(self) -> dict[str, Any]:
        """The defaults under the first group's current values (a scheduler-set ``lr``)."""
        config = dict(self.defaults)
        if self.param_groups:
            config.update((k, v) for k, v in self.param_groups[0].items() if k not in _NON_HPARAM_KEYS)
            config["lr"] = self.get_lr()
        return config

    def get_lr(self) -> float | Tensor:
        """The first group's ``lr`` over its ``lr_scale``, so ``set_lr(get_lr())``
        changes nothing; a tensor ``lr`` (torch.compile's recipe) comes back a copy."""
        group = self.param_groups[0]
        lr, scale = group["lr"], group.get("lr_scale", 1.0)
        if isinstance(lr, Tensor):
            return lr.detach().clone() if scale == 1.0 else lr.detach() / scale
        return float(lr) / float(scale)

    def get_lrs(self) -> list[float | Tensor]:
        """Every group's ``lr`` as stored (``lr_scale`` applied)."""
        return [g["lr"] if isinstance(g["lr"], Tensor) else float(g["lr"]) for g in self.param_groups]

    def set_lr(self, lr: float | Tensor | Sequence[float | Tensor]) -> None:
        """One number sets each group to ``lr * lr_scale``; a sequence, one per group.
        A tensor ``lr`` is filled in place, so compiled steps see no new value. A group
        whose lr is ``None`` computes its own step size (Adafactor's relative step) and keeps it."""
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
            if group["lr"] is None:
                continue
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(value.detach() if isinstance(value, Tensor) else value)
            else:
                group["lr"] = float(value)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def multiply_grads(self, c: float | Tensor) -> None:
        multiply([p.grad for p in params_with_grad(self.param_groups)], c)

    def clip_grad_norm(
        self,
        max_norm: float,
        aggregate_norm_fn: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """A non-finite norm leaves the grads alone, so a loss scaler can skip the step.
        With a ``shard_group`` the norm is over the shards of all its ranks."""
        grads = [p.grad for p in params_with_grad(self.param_groups)]
        if not grads and self.shard_group is None:
            return torch.zeros(())
        return clip_by_norm(grads, max_norm, self.multiply_grads, self.shard_group, aggregate_norm_fn)

    def average_params(self, group: Any = None) -> None:
        """Parameters and their moments (floating state of their shape), one flat
        buffer per device and dtype: a handful of collectives, not one per tensor."""
        average_optimizer(self, group)

    def __getstate__(self) -> dict[str, Any]:
        """Every attribute (docs/contract.md) but a ``step`` an LR scheduler bound
        to this object (a copy has no scheduler) and the ``shard_group``."""
        state = self.__dict__.copy()
        state.pop("step", None)
        state.pop("shard_group", None)  # a process group belongs to this process
        return state

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """torch's, plus ``"optcore": {"name", "provider", "version", "param_shapes"}``
        when built by optcore (the shapes of the parameters with state)."""
        state_dict = super().state_dict()  # type: ignore[misc]
        if type(self).state_dict is ContractMixin.state_dict:  # not a subclass's own (checked when it returns)
            check_dcp_layout(self, state_dict)
        return _dcp.add_records(self, state_dict)

    def load_state_dict(  # type: ignore[override]
        self,
        state_dict: Mapping[str, Any],
        optimizer_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Another version of the saver loads with a warning; a plain torch state
        dict is checked against the parameters only."""
        if not isinstance(state_dict, Mapping):
            raise ConfigError(f"load_state_dict takes an optimizer's state_dict (a mapping), got {type(state_dict).__name__}.")
        record, in_groups, state_dict = _dcp.take_records(self, state_dict)
        overrides = dict(optimizer_overrides or {})
        known = set(self.defaults) | {k for g in self.param_groups for k in g} - {"params"}
        unknown = sorted(set(overrides) - known, key=str)
        if unknown:
            raise ConfigError(
                f"optimizer_overrides has unknown hyper-parameter(s) {unknown}; "
                f"this optimizer has {sorted(known - {'param_names'})}.",
                problems=[(str(k), "unknown hyper-parameter") for k in unknown],
                accepted=sorted(known),
            )
        shapes = record.get("param_shapes") if isinstance(record, Mapping) else None
        check_state_dict(self, state_dict, shapes, overrides, _valid_group)
        try:
            super().load_state_dict(state_dict)  # type: ignore[misc]
        except (TypeError, KeyError, ValueError, IndexError, AttributeError) as exc:  # torch's, on a tampered dict
            raise ConfigError(
                f"This state_dict does not load: {type(exc).__name__}: {clean_text(exc, 300)}. The checkpoint is "
                "damaged or not this optimizer's; load the one that was saved, or skip load_state_dict to start fresh.",
                problems=[("state_dict", type(exc).__name__)],
            ) from exc
        _dcp.loaded(self, in_groups)
        for group in self.param_groups:  # a switch an older checkpoint lacks: this optimizer's own default
            owner = self.part_for(group) if hasattr(self, "part_for") else self
            for key, value in owner.defaults.items():
                if key != "params":
                    group.setdefault(key, value)
        if overrides:
            for group in self.param_groups:
                for key, value in overrides.items():
                    if key == "lr" and group.get("lr_scale", 1.0) != 1.0:
                        value = value * group["lr_scale"]
                    if isinstance(group.get(key), Tensor) and not isinstance(value, Tensor):
                        group[key].fill_(value)
                    else:
                        group[key] = value
            self.defaults.update({k: v for k, v in overrides.items() if k in self.defaults})

    def _select_groups(self, groups: GroupSelector) -> list[dict[str, Any]]:
        """The groups named by index or config ``name`` (every group of that name:
        a named config group may be split, its biases and norms without decay);
        ``None`` selects all."""
        if groups is None:
            return list(self.param_groups)
        names, count = [g.get("name") for g in self.param_groups], len(self.param_groups)
        selected: list[dict[str, Any]] = []
        for key in groups if isinstance(groups, Iterable) and not isinstance(groups, str) else [groups]:
            indices = [i for i, n in enumerate(names) if n == key] if isinstance(key, str) else [key]
            if not indices or any(isinstance(i, bool) or not isinstance(i, int) or not -count <= i < count for i in indices):
                known = list(dict.fromkeys(n for n in names if n is not None))
                raise StepError(
                    f"step(groups=...) names unknown group {key!r}; groups are selected by "
                    f"index (0..{count - 1}) or by name ({known or 'none named'})."
                )
            selected += [self.param_groups[i] for i in indices if all(self.param_groups[i] is not g for g in selected)]
        return selected

    #: LBFGS-like classes re-evaluate the closure inside their step.
    _passes_closure: ClassVar[bool] = False
    _original_step: ClassVar[Callable[..., Any] | None] = None

    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        """A plain ``step()`` is one call of the class's own, so torch.compile sees
        the graph breaks torch's optimizer has, and no more."""
        original = self._original_step
        if scale == 1.0 and groups is None and original is not None and (closure is None or self._passes_closure):
            return original(self, closure)
        return self._contract_step(closure, scale, groups)

    def _contract_step(self, closure: Callable[[], float] | None, scale: float, groups: GroupSelector) -> float | None:
        if self._passes_closure:
            if scale != 1.0 or groups is not None:
                raise StepError(
                    f"{type(self).__name__} re-evaluates the closure inside step, so it cannot take "
                    "scale= or groups=; unscale the loss in the closure instead."
                )
            return self._base_step(closure)
        if groups is not None and not (self.supports_groups and param_groups_assignable(type(self))):
            why = (
                "its param_groups is a read-only property (it wraps another optimizer or derives its groups), "
                "so optcore cannot restrict a step to some of them"
                if not param_groups_assignable(type(self))
                else "its update may couple param groups (or optcore cannot vouch that it does not)"
            )
            raise StepError(
                f"{type(self).__name__} does not support step(groups=...): {why}. Step all groups, or use an "
                "optimizer whose supports_groups is True."
            )
        with torch.enable_grad():
            loss = closure() if closure is not None else None
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

    def _scaled_step(self, scale: float) -> None:
        if scale != 1.0:
            self.multiply_grads(1.0 / scale)
        self._base_step(None)

    def _base_step(self, closure: Callable[[], float] | None) -> float | None:
        """Without torch's profiling wrapper: ours already runs the step hooks."""
        original = self._original_step
        if original is None:  # a ContractMixin subclass not made by adapt()
            return super().step(closure)  # type: ignore[misc]
        return original(self, closure)


def _valid_group(owner: Any, values: Mapping[str, Any], label: str) -> None:
    """A loaded param group's values through its optimizer's schema, as a config's are."""
    from ._schema import validate_hparams  # pydantic: imported when a state dict loads, not with optcore

    spec = getattr(owner, "optcore_spec", None)
    schema = spec.schema if spec is not None else getattr(type(owner), "config_schema", None)  # built directly
    if callable(schema) and not isinstance(schema, type):
        schema = schema()  # a loader, as OptimizerSpec.schema takes one
    if schema is not None:
        validate_hparams(schema, {k: v for k, v in values.items() if k in schema.model_fields}, label)


def _installing(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def installing(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        install_first_step_checks(self)

    installing.__optcore_carried__ = True  # type: ignore[attr-defined]
    return installing


def param_groups_assignable(cls: type) -> bool:
    """False for a read-only ``param_groups`` (Lookahead-style wrappers)."""
    attr = inspect.getattr_static(cls, "param_groups", None)
    return not (isinstance(attr, property) and attr.fset is None)


class Optimizer(ContractMixin, torch.optim.Optimizer):
    """Base of native optimizers: ``step`` folds ``1/scale`` into the update and
    steps :meth:`_select_groups`; a pydantic ``config_schema`` is optional."""

    config_schema: ClassVar[Any] = None

    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        raise NotImplementedError(f"{type(self).__name__} must implement step(closure, scale, groups)")

