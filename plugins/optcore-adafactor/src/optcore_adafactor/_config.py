"""The hyper-parameter schema of :class:`~optcore_adafactor.Adafactor`.

Field names and defaults are those of fairseq and Hugging Face
(``transformers.optimization.Adafactor``), so an existing config moves over
unchanged. The combinations those libraries reject with a bare ``ValueError``
(or silently ignore) fail validation here at the field to change, so
``optcore.plugin.validate_hparams`` reports them in its :class:`optcore.ConfigError`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from optcore.plugin import LR, Beta, Flag, HParams, Literalish, WeightDecay

_SCHEDULER_NOTE = (
    "An external LR scheduler needs relative_step=False and scale_parameter=False "
    "(and a manual lr), otherwise Adafactor computes its own step size."
)

PositiveFloat = Annotated[float, Field(gt=0.0), Literalish]
NonNegFloat = Annotated[float, Field(ge=0.0), Literalish]


class AdafactorConfig(HParams):
    """Hyper-parameters of Adafactor (Shazeer & Stern 2018), fairseq / HF semantics."""

    lr: Annotated[LR | None, Literalish] = Field(
        None,
        description=(
            "External learning rate. Leave None with relative_step=True (Adafactor computes "
            "its own step size); required with relative_step=False. " + _SCHEDULER_NOTE
        ),
    )
    eps: Annotated[tuple[NonNegFloat, NonNegFloat], Literalish] = Field(
        (1e-30, 1e-3),
        description=(
            "(eps1, eps2): eps1 is added to the squared gradient (regularises the second "
            "moment); eps2 is the least parameter scale used by scale_parameter."
        ),
    )
    clip_threshold: PositiveFloat = Field(
        1.0, description="Threshold d of update clipping: the update's RMS is capped at d."
    )
    decay_rate: Annotated[float, Field(le=0.0), Literalish] = Field(
        -0.8, description="Exponent c of the second-moment decay beta2_t = 1 - t^c (<= 0)."
    )
    beta1: Annotated[Beta | None, Literalish] = Field(
        None,
        description="Coefficient of the first moment (momentum); None keeps no first moment "
        "and so no state of the parameter's size.",
    )
    weight_decay: WeightDecay = Field(
        0.0, description="Decoupled weight decay: p -= weight_decay * step_size * p (as Hugging Face)."
    )
    scale_parameter: Flag = Field(
        True,
        description="Multiply the step size by max(eps2, RMS(param)): relative updates. "
        + _SCHEDULER_NOTE,
    )
    relative_step: Flag = Field(
        True,
        description="Compute the step size as min(1e-2, 1/sqrt(step)) (or min(1e-6*step, "
        "1/sqrt(step)) with warmup_init) instead of using lr. " + _SCHEDULER_NOTE,
    )
    warmup_init: Flag = Field(
        False,
        description="Warm the relative step size up linearly: min(1e-6*step, 1/sqrt(step)). "
        "Needs relative_step=True.",
    )

    implementation: Literal["auto", "c", "torch", "compiled"] = Field(
        "auto",
        description=(
            "How the update runs. 'torch': the functional update (adafactor_update) as torch ops; "
            "'compiled': the same function through torch.compile, one graph per (device, dtype, kind "
            "of parameter); 'c': one C call per step for the float32 CPU matrices and vectors (built "
            "with the system C compiler; an error if none works), the functional update elsewhere; "
            "'auto': 'c' where it builds, else 'torch'. Under torch.compile(opt.step) the functional "
            "update is traced whatever is chosen."
        ),
    )

    @model_validator(mode="after")
    def _check_step_size_mode(self) -> AdafactorConfig:
        """Reject the combinations where a setting would be silently ignored.

        Raised as a ``ValidationError`` located at the field to change, so that
        ``validate_hparams`` reports it like any other bad field."""
        problems: list[tuple[str, str, object]] = []
        if self.lr is not None and self.relative_step:
            problems.append((
                "lr",
                "a manual lr is ignored with relative_step=True: set relative_step=False "
                "(and usually scale_parameter=False) to use it, or drop lr to let Adafactor "
                "compute its own step size",
                self.lr,
            ))
        if self.lr is None and not self.relative_step:
            problems.append((
                "lr",
                "relative_step=False needs a manual lr: set lr (e.g. 1e-3), or set relative_step=True",
                self.lr,
            ))
        if self.warmup_init and not self.relative_step:
            problems.append((
                "warmup_init",
                "warmup_init=True only warms up the relative step size: set relative_step=True "
                "(without lr), or set warmup_init=False and warm up with your LR scheduler",
                self.warmup_init,
            ))
        if problems:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(type=PydanticCustomError("adafactor_step_size", msg), loc=(field,), input=value)
                    for field, msg, value in problems
                ],
            )
        return self
