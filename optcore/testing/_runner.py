"""Running checks: :func:`run_check` and :func:`run_conformance`.

Both take a config as ``build_optimizer`` does (a mapping with ``type``, or a
name), resolve it, find its :class:`~optcore.testing.ConformanceInputs` (or use
the ones given), and run the check in one parameter dtype. A check the inputs
skip (or a dtype they do not list) is a pytest skip under pytest and a
:class:`ConformanceSkip` otherwise; a failure is an ``AssertionError`` naming
the optimizer, the check and the dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from ._checks import CHECKS
from ._fixtures import full_config
from ._inputs import DTYPES, ConformanceInputs, inputs_for


class ConformanceSkip(Exception):
    """Raised by :func:`run_check` for a check the inputs say to skip (outside pytest)."""


def _skip(reason: str) -> None:
    try:
        import pytest
    except ImportError:  # pragma: no cover
        raise ConformanceSkip(reason) from None
    pytest.skip(reason)


def _dtype_name(dtype: str | torch.dtype) -> str:
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; the kit runs in {sorted(DTYPES)}")
    return name


def run_check(
    name: str, config: Any, inputs: ConformanceInputs | None = None, dtype: str | torch.dtype = "float32"
) -> None:
    """Run check ``name`` on ``config`` with parameters of ``dtype`` (a name of
    :data:`~optcore.testing.DTYPES` or a ``torch.dtype``). A dtype the inputs do
    not list in ``dtypes`` is skipped, with the reason."""
    from .._config import optimizer_config
    from .._registry import resolve

    cfg = optimizer_config(config)
    spec = resolve(cfg["type"])
    inputs = inputs or inputs_for(spec)
    dtype_name = _dtype_name(dtype)
    reason = inputs.skip.get(name) or inputs.skip.get("*")
    if not reason and dtype_name not in {_dtype_name(d) for d in inputs.dtypes}:
        reason = f"{spec.qualified} does not declare {dtype_name} parameters (its inputs' dtypes: {list(inputs.dtypes)})"
    if reason:
        _skip(reason)
        return
    try:
        CHECKS[name](full_config(cfg, inputs), inputs, DTYPES[dtype_name])
    except AssertionError as exc:
        raise AssertionError(f"[{spec.qualified}, {dtype_name}] conformance check {name!r} failed: {exc}") from None


def run_conformance(
    config: Any,
    inputs: ConformanceInputs | None = None,
    checks: list[str] | None = None,
    dtypes: list[str | torch.dtype] | None = None,
) -> None:
    """Run every check (or ``checks``) on ``config``, in every dtype the inputs
    declare (or ``dtypes``); raise on the first failure."""
    if dtypes is None:
        from .._config import optimizer_config
        from .._registry import resolve

        dtypes = list((inputs or inputs_for(resolve(optimizer_config(config)["type"]))).dtypes)
    for dtype in dtypes:
        for name in checks or list(CHECKS):
            run_check(name, config, inputs, dtype)
