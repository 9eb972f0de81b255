"""The field types hyper-parameter schemas share, and their base class ``HParams``.

Its own module so that every schema (torch's, the schedules', the plugins',
and those derived from signatures) spells a constraint the same way: a
learning rate is ``LR`` everywhere, a switch is ``Flag`` (never judged by
truthiness), and no float takes ``inf`` or ``nan`` unless it says so.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WrapValidator

from ._literals import parse_literal


def _number(value: Any) -> Any:
    """Before pydantic's number check: parse a literal string, refuse booleans
    (pydantic would read ``True`` as ``1.0``). ``inf``/``nan`` are refused by
    the field's ``allow_inf_nan=False``."""
    value = parse_literal(value)
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number; write a number such as 0.001")
    return value


def _flag(value: Any) -> Any:
    """Before pydantic's (strict) bool check: a literal string is parsed
    (``"true"``, ``"none"``), and no other value is read by truthiness
    (``"false"`` would be true, ``0`` would be false)."""
    value = parse_literal(value)
    if value is None or isinstance(value, bool):
        return value
    raise ValueError("must be true or false")


def _keep_tensor(value: Any, handler: Any) -> Any:
    """A 0-dim floating-point tensor lr (capturable/compiled optimizers) passes
    through unchanged, after the same checks as a float."""
    tensor_type = type(value)
    if tensor_type.__module__.startswith("torch"):
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


# Field types shared by schemas, so constraints read the same everywhere.
Literalish = BeforeValidator(parse_literal)
#: a number: literal strings parsed, booleans refused
Numberish = BeforeValidator(_number)
#: a boolean switch: True/False or "true"/"false", never truthiness
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
    """Base class of hyper-parameter schemas: unknown fields are errors,
    string values that spell literals are parsed first, and no float field
    takes ``inf`` or ``nan`` unless it says so (``Field(allow_inf_nan=True)``):
    a non-finite hyper-parameter leaves non-finite parameters after one step."""

    model_config = ConfigDict(
        extra="forbid",
        arbitrary_types_allowed=True,
        validate_default=False,
        populate_by_name=True,
        allow_inf_nan=False,
    )
