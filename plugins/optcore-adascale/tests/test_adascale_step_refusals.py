"""A gradient or momentum no step can use is a StepError, with the parameters,
the momentum and the gain statistics bit-identical afterwards."""

from __future__ import annotations

import warnings

import pytest
import torch
from optcore_adascale import AdaScaleSGD

from optcore.testing import BAD_STEP_INPUTS, assert_step_refused


@pytest.mark.parametrize("case", list(BAD_STEP_INPUTS))
def test_a_tensor_no_step_can_use_is_a_step_error_that_changes_nothing(case):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(8, 6, generator=gen).requires_grad_(), torch.randn(6, generator=gen).requires_grad_()]
    opt = AdaScaleSGD(params, lr=1e-2, momentum=0.9, num_gradients_to_accumulate=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradients set by hand: the gain measures nothing
        for _ in range(2):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        assert_step_refused(opt, params, BAD_STEP_INPUTS[case], params[0], opt.state[params[0]], case)
