"""Schemas for the optimizers in ``torch.optim``: the fields and defaults of the
installed torch's own signature, each typed by its name with the constraints
torch enforces (or should: it accepts ``momentum=-1`` for SGD).

Why from the signature: optcore admits torch 2.4 and newer, and the classes
gain arguments (``Adam``'s ``decoupled_weight_decay`` is newer than 2.4); a
field the installed class lacks would be passed to it and fail every build.
``tests/config/test_schema_values.py`` checks that every argument of the pinned
torch has its constraint here, so none falls back to its bare annotation.
"""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, model_validator

from ._fields import LR, Beta, Betas, Eps, Flag, HParams, Literalish, Momentum, OptionalFlag, WeightDecay
from ._schema import schema_from_signature

NonNegative = Annotated[float, Field(ge=0.0), Literalish]
Positive = Annotated[float, Field(gt=0.0), Literalish]
PositiveInt = Annotated[int, Field(gt=0), Literalish]
Fraction = Annotated[float, Field(ge=0.0, le=1.0), Literalish]

#: an argument's type by its name, whichever class takes it
FIELDS: dict[str, Any] = {
    "lr": LR, "betas": Betas, "eps": Eps, "weight_decay": WeightDecay, "momentum": Momentum,
    **dict.fromkeys(("dampening", "lr_decay", "initial_accumulator_value", "momentum_decay", "lambd", "alpha", "t0",
                     "tolerance_grad", "tolerance_change"), NonNegative),
    **dict.fromkeys(("max_iter", "history_size", "ns_steps"), PositiveInt),
    **dict.fromkeys(("amsgrad", "nesterov", "centered", "capturable", "decoupled_weight_decay"), Flag),
    "maximize": Annotated[Flag, Field(description="maximize the objective instead of minimizing")],
    "foreach": Annotated[OptionalFlag, Field(description="multi-tensor path; None lets optcore choose")],
    "differentiable": Annotated[Flag, Field(description="autograd through the step (slow)")],
    "fused": Annotated[OptionalFlag, Field(description="fused kernel; None = fused where the device supports it")],
    "rho": Fraction,
    "d": Positive,
    "max_eval": Annotated[int | None, Field(gt=0), Literalish],
    "etas": Annotated[tuple[Positive, Positive], Field(description="(decrease, increase) factors"), Literalish],
    "step_sizes": Annotated[tuple[NonNegative, NonNegative], Field(description="(min, max) step"), Literalish],
    "beta2_decay": Annotated[float, Field(le=0.0), Literalish],
    "ns_coefficients": Annotated[tuple[float, float, float], Literalish],
    "line_search_fn": Literal["strong_wolfe"] | None,
    "adjust_lr_fn": Literal["original", "match_rms_adamw"] | None,
}
#: where one class's argument of that name means something else
OWN_FIELDS: dict[str, dict[str, Any]] = {
    "RMSprop": {"alpha": Annotated[Fraction, Field(description="smoothing constant")]},
    "Muon": {"momentum": Beta},
    "Adafactor": {"eps": Annotated[tuple[NonNegative | None, NonNegative], Literalish]},  # (eps1 or None, eps2)
}


#: what torch's first paragraph does not say and a user choosing between providers needs
NOTES = {"Adafactor": "torch's own: no relative step, no update clipping; not the fairseq/Hugging Face algorithm "
         "(that is optcore-adafactor's)."}


class _TorchHParams(HParams):
    """The rules between arguments, which torch checks only at the first step or not at all."""

    @model_validator(mode="after")
    def _consistent(self) -> _TorchHParams:
        given = self.__dict__
        if given.get("fused") and given.get("foreach"):
            raise ValueError("fused=True and foreach=True are exclusive: set one of them")
        if given.get("fused") and given.get("differentiable"):
            raise ValueError("fused=True does not support differentiable=True")
        if "dampening" in given and given.get("nesterov") and (given["momentum"] <= 0 or given["dampening"] != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")
        etas = given.get("etas")
        if etas is not None and not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"etas must satisfy 0 < etaminus < 1 < etaplus, got {etas}")
        return self


@functools.cache
def torch_schema(name: str) -> type[HParams]:
    """The schema of ``torch.optim.<name>`` (named ``Torch<name>Config``: not a plugin's ``AdafactorConfig``)."""
    cls = getattr(torch.optim, name)
    summary = " ".join(inspect.cleandoc(cls.__doc__ or name).split("\n\n")[0].split())  # torch's first paragraph
    summary = f"{summary} {NOTES[name]}" if name in NOTES else summary
    fields = {**FIELDS, **OWN_FIELDS.get(name, {})}
    return schema_from_signature(cls, name=f"Torch{name}", fields=fields, base=_TorchHParams, doc=summary)
