"""What the kit needs to know about an optimizer: :class:`ConformanceInputs`.

The checks are the same for every optimizer; what differs is data. An
optimizer declares its record as a ``conformance_inputs`` class attribute (a
:class:`ConformanceInputs` or a dict of its fields); optcore keeps the records
of ``torch.optim`` classes and of a few third-party classes here, in tables;
a test may pass its own. :func:`inputs_for` finds the record of a resolved spec.

Public names: :class:`ConformanceInputs`, :func:`inputs_for`, :func:`with_config`,
:data:`DTYPES` (the dtypes the kit knows, by name).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

#: The parameter dtypes the kit can run a check in, by the name tests use as an id.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_FULL_PRECISION = ("float32", "float64")
_WITH_BF16 = ("float32", "float64", "bfloat16")


@dataclass(frozen=True)
class ConformanceInputs:
    """What a check needs to know about an optimizer."""

    #: hyper-parameters to add to the config for the checks (e.g. a usable lr)
    config: dict[str, Any] = field(default_factory=dict)
    #: the optimizer evaluates the closure itself, several times (LBFGS)
    needs_closure: bool = False
    #: only 2-D parameters (Muon)
    matrices_only: bool = False
    #: steps for the convergence check, and the loss ratio it must reach
    converge_steps: int = 150
    converge_ratio: float = 0.5
    #: absolute tolerance for "same result" comparisons in fp32 and fp64
    atol: float = 1e-6
    #: the same, for bf16 and fp16 parameters (one bf16 rounding is ~4e-3 of a value)
    low_precision_atol: float = 2e-2
    #: parameter dtypes the optimizer supports (names from :data:`DTYPES`); every
    #: check runs in each. Full precision by default; bf16/fp16 where declared.
    dtypes: tuple[str, ...] = _FULL_PRECISION
    #: step() takes the contract's preamble (optcore.plugin.prepare_step): a sparse
    #: gradient, state of another shape and a bad scale are StepErrors that change nothing
    step_errors: bool = False
    #: checks to skip, with the reason (shown as the skip message)
    skip: dict[str, str] = field(default_factory=dict)

    def atol_for(self, dtype: torch.dtype) -> float:
        """The tolerance of "same result" comparisons for parameters of ``dtype``."""
        return self.atol if dtype in (torch.float32, torch.float64) else max(self.atol, self.low_precision_atol)


_TORCH_INPUTS: dict[str, ConformanceInputs] = {
    "LBFGS": ConformanceInputs(
        needs_closure=True,
        config={"line_search_fn": "strong_wolfe"},
        skip={"step_with_scale": "LBFGS re-evaluates the closure", "groups": "LBFGS supports one param group"},
    ),
    "SparseAdam": ConformanceInputs(skip={"*": "SparseAdam takes sparse gradients only"}),
    "Muon": ConformanceInputs(matrices_only=True, config={"lr": 0.02}, dtypes=_WITH_BF16),
    "Adadelta": ConformanceInputs(config={"lr": 1.0}, converge_steps=300, dtypes=_WITH_BF16),
    "ASGD": ConformanceInputs(config={"lr": 0.05}, dtypes=_WITH_BF16),
    "SGD": ConformanceInputs(config={"lr": 0.05, "momentum": 0.9}, dtypes=_WITH_BF16),
    "Rprop": ConformanceInputs(config={"lr": 0.01}, dtypes=_WITH_BF16),
    **{name: ConformanceInputs(dtypes=_WITH_BF16) for name in ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad")},
}


#: Inputs for third-party classes, keyed by qualified name (data, like the torch table).
_PACKAGE_INPUTS: dict[str, ConformanceInputs] = {
    "transformers.optimization:Adafactor": ConformanceInputs(
        config={"lr": 1e-2, "relative_step": False, "scale_parameter": False, "warmup_init": False}
    ),
    "pytorch_optimizer:DAdaptLion": ConformanceInputs(config={"lr": 1.0}),
    "pytorch_optimizer:DAdaptSGD": ConformanceInputs(config={"lr": 1.0}),
    "pytorch_optimizer:DAdaptAdam": ConformanceInputs(config={"lr": 1.0}),
    "pytorch_optimizer:Prodigy": ConformanceInputs(config={"lr": 1.0}),
    # FAdam builds fp32 tensors internally (torch.lerp(..., end=fp32)) and fails on fp64 params.
    "pytorch_optimizer:FAdam": ConformanceInputs(dtypes=("float32",)),
    # bitsandbytes' 8-bit SGD and LARS refuse momentum=0 (their state is the momentum buffer)
    "bitsandbytes.optim:SGD8bit": ConformanceInputs(config={"lr": 0.05, "momentum": 0.9}),
    "bitsandbytes.optim:LARS8bit": ConformanceInputs(config={"lr": 0.05, "momentum": 0.9}),
    # bitsandbytes' paged optimizers run unpaged on the CPU, and warn on each build that they do
    **{f"bitsandbytes.optim:{name}": ConformanceInputs(skip={} if torch.cuda.is_available() else {
        "lr_scheduler": "bitsandbytes' paged optimizers warn on the CPU that they fall back to unpaged memory, "
        "and this check fails on any warning (a scheduler stepped out of order warns)"})
       for name in ("PagedAdam8bit", "PagedAdamW8bit", "PagedAdamW32bit", "PagedLion8bit")},
    # GaLore projects each matrix (the kit's are 8 wide: rank 2), re-fitting the projection every 2 steps
    "galore_torch:GaLoreAdamW": ConformanceInputs(matrices_only=True, config={"lr": 1e-2, "rank": 2, "update_proj_gap": 2}),
    "galore_torch:GaLoreAdafactor": ConformanceInputs(
        matrices_only=True,
        config={"lr": 1e-2, "relative_step": False, "scale_parameter": False, "warmup_init": False, "rank": 2,
                "update_proj_gap": 2},
    ),
    "galore_torch:GaLoreAdamW8bit": ConformanceInputs(
        matrices_only=True,
        config={"lr": 1e-2, "rank": 2, "update_proj_gap": 2},
        skip={} if torch.cuda.is_available() else {
            "*": "galore_torch's GaLoreAdamW8bit moves its state to CUDA in its first step (bitsandbytes' to_gpu), "
            "and this machine has no CUDA device"},
    ),
}


def inputs_for(spec: Any) -> ConformanceInputs:
    """The conformance inputs of a resolved spec: the class's own
    ``conformance_inputs``, then optcore's tables, then defaults (with
    ``lr=1e-3`` for classes that have no default learning rate)."""
    declared = getattr(spec.target, "conformance_inputs", None)
    if isinstance(declared, ConformanceInputs):
        return declared
    if isinstance(declared, dict):
        return ConformanceInputs(**declared)
    if spec.source == "torch" and spec.name in _TORCH_INPUTS:
        return _TORCH_INPUTS[spec.name]
    if spec.qualified in _PACKAGE_INPUTS:
        return _PACKAGE_INPUTS[spec.qualified]
    field_info = getattr(spec.schema, "model_fields", {}).get("lr")
    if field_info is not None and field_info.is_required():
        return ConformanceInputs(config={"lr": 1e-3})  # classes without a default lr
    return ConformanceInputs()


def with_config(inputs: ConformanceInputs, **config: Any) -> ConformanceInputs:
    """``inputs`` with extra config keys."""
    return replace(inputs, config={**inputs.config, **config})
