"""The hyper-parameter schema of :class:`~optcore_adascale.AdaScaleSGD`.

Names and defaults are fairscale's ``AdaScale`` (wrapping ``torch.optim.SGD``)
so an existing config moves over unchanged; the SGD fields are torch's.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from optcore.plugin import LR, Flag, HParams, Literalish, Momentum, WeightDecay


class AdaScaleSGDConfig(HParams):
    """Hyper-parameters of AdaScaleSGD: torch.optim.SGD's plus fairscale AdaScale's."""

    lr: LR = Field(1e-3, description="Base learning rate (at scale 1); each step uses lr * gain.")
    momentum: Momentum = Field(0.0, description="Momentum factor, as torch.optim.SGD.")
    dampening: Annotated[float, Literalish] = Field(0.0, description="Dampening for momentum, as torch.optim.SGD.")
    weight_decay: WeightDecay = Field(0.0, description="L2 penalty added to the gradient, as torch.optim.SGD.")
    nesterov: Flag = Field(False, description="Nesterov momentum (needs momentum > 0 and dampening 0).")
    num_gradients_to_accumulate: Annotated[int, Field(ge=1), Literalish] = Field(
        1,
        description="Backward passes accumulated locally (under DDP's no_sync) between two steps; "
        "each one is a gradient sample for the variance estimate.",
    )
    scale: Annotated[Annotated[float, Field(ge=1.0)] | None, Literalish] = Field(
        None,
        description="Batch size relative to the one lr was tuned for; None = world size x "
        "num_gradients_to_accumulate.",
    )
    smoothing: Annotated[Annotated[float, Field(ge=0.0, lt=1.0)] | None, Literalish] = Field(
        None,
        description="Factor of the moving averages of gradient variance and squared norm; "
        "None = max(1 - world size x num_gradients_to_accumulate / 1000, 0).",
    )
    is_scaled_loss: Flag = Field(
        True,
        description="The loss of each accumulation step is divided by num_gradients_to_accumulate; "
        "if False, step() divides the accumulated gradient itself.",
    )
    debias_ewma: Flag = Field(
        True, description="Debias the moving averages (Adam-style); False uses the paper's Appendix B.3 procedure."
    )
