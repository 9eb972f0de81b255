"""The error AdaScaleSGD raises when a training loop breaks its step protocol."""

from __future__ import annotations

from optcore import StepError


class AccumulationError(StepError):
    """``step()`` (or a change of ``num_gradients_to_accumulate``) came at the
    wrong point of the accumulation: not after exactly
    ``num_gradients_to_accumulate`` backward passes.

    A :class:`optcore.StepError` (so a ``RuntimeError``), not a ``ConfigError``: the configuration is
    valid, the order of calls in the training loop is not (like torch's error
    for a second backward through a freed graph). The estimates and gradients
    are left as they were, so the loop can finish the accumulation and step.
    """
