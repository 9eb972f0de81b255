"""optcore's conformance kit over parameter dtypes (float32 runs in test_lion_optcore):
the kit's models are built in the default dtype, so it is set for each run.
Failures that are the core's or the kit's, not Lion's, are strict xfails."""

from __future__ import annotations

import pytest
import torch
from optcore.testing import CHECKS, run_check

IMPLS = {"default": {}, "foreach": {"foreach": True}, "forloop": {"fused": False, "foreach": False}}
DTYPES = {"float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}  # fp16/bf16: claimed
KNOWN = {
    ("grad_ops", "float64"): "core: total_grad_norm asks _foreach_norm for fp32 norms of fp64 grads (RuntimeError)",
    ("grad_ops", "bfloat16"): "kit: check_grad_ops compares the fp32 norm with a bf16 expected value (dtype error)",
    ("grad_ops", "float16"): "kit: check_grad_ops compares the fp32 norm with an fp16 expected value (dtype error)",
}


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
