"""The field types hyper-parameter schemas share, and their base class ``HParams``,
so that every schema (torch's, the schedules', the plugins', those derived from
signatures) spells a constraint, and the rules of :mod:`._values`, the same way.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WrapValidator

from ._literals import parse_literal


def _number(value: Any) -> Any:
    """Before pydantic's number check: parse a literal string, refuse booleans."""
    value = parse_literal(value)
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number; write a number such as 0.001")
    return value


def _flag(value: Any) -> Any:
    """Before pydantic's strict bool check: parse a literal string, nothing by truthiness."""
    value = parse_literal(value)
    if value is None or isinstance(value, bool):
        return value
    raise ValueError("must be true or false")


def _keep_tensor(value: Any, handler: Any) -> Any:
    """A 0-dim float tensor lr (capturable/compiled optimizers) passes unchanged."""
    if type(value).__module__.startswith("torch"):
        import torch

        if isinstance(value, torch.Tensor):
            if value.dim() != 0 or not value.is_floating_point():
                raise ValueError(
                    f"a tensor learning rate must be a 0-dim floating-point tensor, got shape "
                    f"{tuple(value.shape)} and dtype {value.dtype}"
                )
            number = float(value.detach())
            if not math.isfinite(number) or number < 0:
                raise ValueError(f"a tensor learning rate must be finite and >= 0, got {number}")
            return value
    return handler(value)


Literalish = BeforeValidator(parse_literal)
Numberish = BeforeValidator(_number)
Switch = BeforeValidator(_flag)
Finite = Field(allow_inf_nan=False)
FiniteFloat = Annotated[float, Finite, Numberish]
Integer = Annotated[int, Numberish]
#: for a signature whose default is itself inf (``max_norm=inf``): inf stays allowed
NonFiniteFloat = Annotated[float, Field(allow_inf_nan=True), Numberish]
LR = Annotated[
    float, Field(ge=0.0, allow_inf_nan=False, description="learning rate"), Numberish, WrapValidator(_keep_tensor)
]
Beta = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False), Numberish]
Betas = Annotated[tuple[Beta, Beta], Field(description="coefficients of the running averages"), Literalish]
Eps = Annotated[float, Field(ge=0.0, allow_inf_nan=False, description="term added for numerical stability"), Numberish]
WeightDecay = Annotated[float, Field(ge=0.0, allow_inf_nan=False, description="weight decay coefficient"), Numberish]
Momentum = Annotated[float, Field(ge=0.0, allow_inf_nan=False, description="momentum factor"), Numberish]
StrictBool = Annotated[bool, Field(strict=True)]
Flag = Annotated[bool, Field(strict=True), Switch]
OptionalFlag = Annotated[bool | None, Field(strict=True), Switch]


class HParams(BaseModel):
    """Base class of hyper-parameter schemas: unknown fields are errors, and no
    float takes ``inf`` or ``nan`` unless it says so (``Field(allow_inf_nan=True)``)."""

    model_config = ConfigDict(
        extra="forbid",
        arbitrary_types_allowed=True,
        populate_by_name=True,
        allow_inf_nan=False,
    )
