"""optcore's conformance kit over every parameter dtype Lion declares
(``Lion.conformance_inputs["dtypes"]``), on each implementation path: the
kit builds its models and data in the dtype it is given."""

from __future__ import annotations

import pytest
from optcore.testing import conformance_cases, run_check

LION = {"type": "optcore_lion:Lion", "lr": 1e-3}
IMPLS = {"default": {}, "foreach": {"foreach": True}, "forloop": {"fused": False, "foreach": False}}


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS)
@pytest.mark.parametrize(("check", "dtype"), conformance_cases(LION))
def test_lion_conformance_per_dtype(check, dtype, impl):
    run_check(check, {**LION, **impl}, dtype=dtype)
