"""Running checks: :func:`run_check` and :func:`run_conformance`.

Both take a config as ``build_optimizer`` does (a mapping with ``type``, or a
name), resolve it, find its :class:`~optcore.testing.ConformanceInputs` (or use
the ones given), and run the check in one parameter dtype. A check the inputs
skip (or a dtype they do not list) is a pytest skip under pytest and a
:class:`ConformanceSkip` otherwise; a failure is an ``AssertionError`` naming
the optimizer, the check and the dtype. :func:`conformance_cases` is what a
plugin's test parametrises over: every check in every dtype the optimizer
declares.
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


def _resolved(config: Any, inputs: ConformanceInputs | None) -> tuple[dict[str, Any], Any, ConformanceInputs]:
    from .._config import typed_config
    from .._registry import resolve

    cfg = typed_config(config)
    spec = resolve(cfg["type"])
    return cfg, spec, inputs or inputs_for(spec)


def _skip_reason(name: str, spec: Any, inputs: ConformanceInputs, dtype_name: str) -> str | None:
    if name not in CHECKS:
        raise ValueError(f"unknown conformance check {name!r}; the kit's checks are {list(CHECKS)}")
    reason = inputs.skip.get(name) or inputs.skip.get("*")
    if not reason and dtype_name not in {_dtype_name(d) for d in inputs.dtypes}:
        reason = f"{spec.qualified} does not declare {dtype_name} parameters (its inputs' dtypes: {list(inputs.dtypes)})"
    return reason


def _run(name: str, cfg: dict[str, Any], spec: Any, inputs: ConformanceInputs, dtype_name: str) -> None:
    try:
        CHECKS[name](full_config(cfg, inputs), inputs, DTYPES[dtype_name])
    except AssertionError as exc:
        raise AssertionError(f"[{spec.qualified}, {dtype_name}] conformance check {name!r} failed: {exc}") from None


def run_check(
    name: str, config: Any, inputs: ConformanceInputs | None = None, dtype: str | torch.dtype = "float32"
) -> None:
    """Run check ``name`` on ``config`` with parameters of ``dtype`` (a name of
    :data:`~optcore.testing.DTYPES` or a ``torch.dtype``). A dtype the inputs do
    not list in ``dtypes`` is skipped, with the reason."""
    cfg, spec, inputs = _resolved(config, inputs)
    dtype_name = _dtype_name(dtype)
    reason = _skip_reason(name, spec, inputs, dtype_name)
    if reason:
        _skip(reason)
        return
    _run(name, cfg, spec, inputs, dtype_name)


def conformance_cases(
    config: Any,
    inputs: ConformanceInputs | None = None,
    checks: list[str] | None = None,
    xfail: dict[tuple[str, str], str] | None = None,
) -> list[Any]:
    """``pytest.param(check, dtype)`` for every check (or ``checks``) in every
    dtype the optimizer declares (its inputs' ``dtypes``), with ids such as
    ``converges-bfloat16``: what a plugin's test parametrises over, so that
    each dtype the class claims runs in that dtype, and one it claims later
    runs without editing the test::

        @pytest.mark.parametrize(("check", "dtype"), conformance_cases(LION))
        def test_lion_conformance(check, dtype):
            run_check(check, LION, dtype=dtype)

    ``xfail`` maps ``(check, dtype)`` to the reason of a known failure, run as
    a strict xfail so that a fix is noticed. Resolving ``config`` imports the
    optimizer (at collection time, where the helper is used)."""
    import pytest

    _, _, inputs = _resolved(config, inputs)
    dtypes = [_dtype_name(d) for d in inputs.dtypes]
    names = list(checks or CHECKS)
    stray = sorted(set(xfail or {}) - {(n, d) for n in names for d in dtypes})
    if sorted(set(names) - set(CHECKS)) or stray:
        raise ValueError(
            f"conformance_cases: unknown checks {sorted(set(names) - set(CHECKS))} or xfail entries {stray} "
            f"outside the cases; the checks are {list(CHECKS)}, the declared dtypes {dtypes}"
        )
    cases = []
    for dtype in dtypes:
        for name in names:
            reason = (xfail or {}).get((name, dtype))
            marks = [pytest.mark.xfail(reason=reason, strict=True, raises=AssertionError)] if reason else []
            cases.append(pytest.param(name, dtype, id=f"{name}-{dtype}", marks=marks))
    return cases


def run_conformance(
    config: Any,
    inputs: ConformanceInputs | None = None,
    checks: list[str] | None = None,
    dtypes: list[str | torch.dtype] | None = None,
) -> list[tuple[str, str, str]]:
    """Run every check (or ``checks``) on ``config``, in every dtype the inputs
    declare (or ``dtypes``), and raise on the first failure. A skipped check
    does not end the run: the skips come back as ``(check, dtype, reason)``."""
    cfg, spec, inputs = _resolved(config, inputs)
    skipped = []
    for dtype_name in [_dtype_name(d) for d in (inputs.dtypes if dtypes is None else dtypes)]:
        for name in checks or list(CHECKS):
            reason = _skip_reason(name, spec, inputs, dtype_name)
            if reason:
                skipped.append((name, dtype_name, reason))
            else:
                _run(name, cfg, spec, inputs, dtype_name)
    return skipped
