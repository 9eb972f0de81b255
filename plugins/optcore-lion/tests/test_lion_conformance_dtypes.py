"""optcore's conformance kit over parameter dtypes (float32 runs in test_lion_optcore):
the kit's models are built in the default dtype, so it is set for each run.
Failures that are the core's or the kit's, not Lion's, are strict xfails."""

from __future__ import annotations

import pytest
import torch
from optcore.testing import CHECKS, run_check

IMPLS = {"default": {}, "foreach": {"foreach": True}, "forloop": {"fused": False, "foreach": False}}
DTYPES = {"float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}  # fp16/bf16: claimed
KNOWN = {}  # none left: the core and kit fixes landed


@pytest.fixture
def default_dtype(request):
    before = torch.get_default_dtype()
    torch.set_default_dtype(request.param)
    yield request.param
    torch.set_default_dtype(before)


@pytest.mark.parametrize("default_dtype", DTYPES.values(), ids=DTYPES, indirect=True)
@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS)
@pytest.mark.parametrize("check", CHECKS)
def test_lion_conformance_per_dtype(check, impl, default_dtype, request):
    reason = KNOWN.get((check, str(default_dtype).removeprefix("torch.")))
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    run_check(check, {"type": "optcore_lion:Lion", "lr": 1e-3, **impl})
