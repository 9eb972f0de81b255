"""A gradient or state tensor no backend can step is a StepError on every
implementation (the C loops, torch ops, compiled), with the parameters, the
statistics and the step counts bit-identical afterwards; a non-contiguous or
float64 statistic and an expanded gradient step."""

from __future__ import annotations

import pytest
import torch
from optcore_adafactor import Adafactor, _cpu_kernel

from optcore.testing import BAD_STEP_INPUTS, STEPPABLE_STEP_INPUTS, assert_step_refused

IMPLEMENTATIONS = ["c", "auto", "torch", "compiled"]


def _stepped(implementation: str, beta1: float | None = 0.9) -> tuple[Adafactor, list[torch.Tensor]]:
    if implementation == "c" and _cpu_kernel.load() is None:
        pytest.skip(f"C kernel unavailable: {_cpu_kernel.unavailable_reason}")
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(8, 6, generator=gen).requires_grad_(), torch.randn(6, generator=gen).requires_grad_()]
    opt = Adafactor(params, lr=1e-2, relative_step=False, beta1=beta1, implementation=implementation)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return opt, params


@pytest.mark.parametrize("case", list(BAD_STEP_INPUTS))
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("which", [0, 1], ids=["matrix", "vector"])
def test_a_tensor_no_implementation_can_step_is_a_step_error_that_changes_nothing(implementation, case, which):
    opt, params = _stepped(implementation)
    p = params[which]
    error = assert_step_refused(opt, params, BAD_STEP_INPUTS[case], p, opt.state[p], case)
    assert f"#{which} of param group 0" in str(error)
    assert all(opt.state[q]["step"] == 2 for q in params)


@pytest.mark.parametrize("case", list(STEPPABLE_STEP_INPUTS))
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_what_the_maths_allows_steps_as_the_honest_tensors_do(implementation, case):
    honest, honest_params = _stepped(implementation)
    spoiled, params = _stepped(implementation)
    STEPPABLE_STEP_INPUTS[case](params[0], spoiled.state[params[0]])
    if case == "expanded gradient":
        honest_params[0].grad = params[0].grad.clone()
    honest.step()
    spoiled.step()
    torch.testing.assert_close(params, honest_params)
    assert all(spoiled.state[p]["step"] == 3 for p in params)
