"""optcore's conformance kit over both wrappers, in every parameter dtype they
declare (``PrecisionWrapper.conformance_inputs["dtypes"]``): fp16 parameters
with precision='fp16', bf16 with 'bf16', and fp32/fp64 with 'fp16' (accepted
with a warning; no gain, but the contract holds)."""

from __future__ import annotations

import pytest
from optcore.testing import conformance_cases, run_check

#: the inner optimizer of each wrapper (the memory-efficient one needs fp32 math and state)
INNER = {
    "FP16Optimizer": {"optimizer": {"type": "AdamW", "lr": 1e-3}},
    "MemoryEfficientFP16Optimizer": {
        "optimizer": {"type": "SGD", "lr": 0.05, "momentum": 0.9},
        "allow_unsupported": True,
    },
}


def _cases():
    """Each wrapper's own cases: every check in every dtype it declares."""
    for wrapper, inner in INNER.items():
        for case in conformance_cases({"type": wrapper, **inner}):
            yield pytest.param(wrapper, *case.values, id=f"{wrapper}-{case.id}", marks=case.marks)


@pytest.mark.filterwarnings("ignore:.*no trainable parameter is")
@pytest.mark.parametrize(("wrapper", "check", "dtype"), _cases())
def test_wrapper_conformance_per_dtype(wrapper, check, dtype):
    precision = "bf16" if dtype == "bfloat16" else "fp16"
    run_check(check, {"type": wrapper, "precision": precision, **INNER[wrapper]}, dtype=dtype)
