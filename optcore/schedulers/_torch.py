"""What optcore knows about ``torch.optim.lr_scheduler`` classes beyond their
signatures: which argument is the run length, which arguments are absolute
learning rates (scaled per group for ``lr_scale``), and schemas for the few
signatures that cannot be derived (callables, nested schedulers)."""

from __future__ import annotations

import collections.abc
import typing
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field, create_model
from torch.optim import Optimizer
from torch.optim import lr_scheduler as tls

from .._errors import warn_user
from .._fields import HParams, Literalish
from .._schema import schema_from_signature

#: class name -> (field that holds the run length, fields that replace it)
TOTAL_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "CosineAnnealingLR": ("T_max", ()),
    "OneCycleLR": ("total_steps", ("epochs",)),
}
#: class name -> arguments that are absolute learning rates (a list gives one per group)
ABSOLUTE_LRS: dict[str, tuple[str, ...]] = {
    "ReduceLROnPlateau": ("min_lr",),
    "OneCycleLR": ("max_lr",),
    "CyclicLR": ("base_lr", "max_lr"),
}
#: scalar-only absolute floors: layer-wise ratios bend near them
SCALAR_FLOORS: dict[str, str] = {"CosineAnnealingLR": "eta_min", "CosineAnnealingWarmRestarts": "eta_min"}
NON_DECAYING = frozenset({"ConstantLR"})
NESTED = frozenset({"SequentialLR", "ChainedScheduler"})


def torch_scheduler_names() -> list[str]:
    """Every public scheduler class of ``torch.optim.lr_scheduler``."""
    return [
        name
        for name in tls.__all__
        if name != "LRScheduler"
        and isinstance(getattr(tls, name, None), type)
        and issubclass(getattr(tls, name), tls.LRScheduler)
    ]


class _LambdaConfig(HParams):
    lr_lambda: Annotated[Any, Field(description="a function of the step (or one per group); Python API only")]
    last_epoch: Annotated[int, Literalish] = -1


class _MultiStepConfig(HParams):
    milestones: Annotated[list[int], Field(description="steps at which the lr is multiplied by gamma"), Literalish]
    gamma: Annotated[float, Field(gt=0.0), Literalish] = 0.1
    last_epoch: Annotated[int, Literalish] = -1


class _SequentialConfig(HParams):
    schedulers: Annotated[list[Any], Field(description="scheduler configs (or schedulers), run one after another")]
    milestones: Annotated[list[int], Field(description="steps at which the next scheduler takes over"), Literalish]
    last_epoch: Annotated[int, Literalish] = -1


class _ChainedConfig(HParams):
    schedulers: Annotated[list[Any], Field(description="scheduler configs (or schedulers), all stepped together")]


_SCHEMAS: dict[str, type[HParams]] = {
    "LambdaLR": _LambdaConfig,
    "MultiplicativeLR": _LambdaConfig,
    "MultiStepLR": _MultiStepConfig,
    "SequentialLR": _SequentialConfig,
    "ChainedScheduler": _ChainedConfig,
}

# Names torch's annotations use without importing them at run time.
_NAMESPACE: dict[str, Any] = {
    **{k: getattr(typing, k) for k in typing.__all__ if hasattr(typing, k)},
    **{k: getattr(collections.abc, k) for k in collections.abc.__all__},
    **vars(tls),
}


def torch_schema(cls: type) -> type[HParams]:
    """The schema of a torch scheduler class: hand-written where the signature
    takes callables or schedulers, else derived from the signature."""
    if cls.__name__ in _SCHEMAS and getattr(tls, cls.__name__, None) is cls:
        return _SCHEMAS[cls.__name__]
    schema = schema_from_signature(cls, name=cls.__name__, skip=("optimizer",))
    if not schema.__pydantic_complete__:  # string annotations (from __future__ import annotations)
        schema.model_rebuild(_types_namespace=_NAMESPACE)
    try:
        schema.model_json_schema()
    except Exception:  # a callable argument (CyclicLR.scale_fn): accept it as is, keep the rest typed
        fields = {
            name: (Any if "Callable" in repr(info.annotation) else info.annotation, info)
            for name, info in schema.model_fields.items()
        }
        schema = create_model(schema.__name__, __base__=HParams, **fields)  # type: ignore[call-overload]
    return schema


def scale_absolute_lrs(cls_name: str, kwargs: dict[str, Any], optimizer: Optimizer) -> dict[str, Any]:
    """Give each group its own copy of absolute-lr arguments, times its
    ``lr_scale``, so layer-wise ratios hold (torch accepts one value per group)."""
    scales = [g.get("lr_scale") for g in optimizer.param_groups]
    if all(s is None for s in scales):
        return kwargs
    out = dict(kwargs)
    for key in ABSOLUTE_LRS.get(cls_name, ()):
        value = out.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = [float(value) * float(1.0 if s is None else s) for s in scales]
    floor = SCALAR_FLOORS.get(cls_name)
    if floor and out.get(floor):
        warn_user(
            f"{cls_name}: {floor}={out[floor]} is one absolute floor for all param groups, so groups with an "
            "lr_scale lose their ratio near the end of the schedule. Use the built-in 'cosine_with_min_lr' "
            "(min_lr_rate) to keep it.", UserWarning)
    return out


def construct(cls: type, optimizer: Optimizer, kwargs: dict[str, Any], build: Callable[[Any], Any]) -> Any:
    """Build a torch scheduler; nested scheduler configs are built first with
    ``build(config)`` (``SequentialLR``, ``ChainedScheduler``)."""
    if cls.__name__ in NESTED:
        kwargs = dict(kwargs)
        kwargs["schedulers"] = [s if isinstance(s, tls.LRScheduler) else build(s) for s in kwargs["schedulers"]]
        if cls.__name__ == "ChainedScheduler":
            return cls(kwargs["schedulers"], optimizer=optimizer)
    return cls(optimizer, **kwargs)
