"""A gradient or state tensor no backend can step is a StepError on every
backend (the C kernel, cache-sized pieces, foreach batches, compiled), with
the parameters and the momentum bit-identical afterwards; what the maths
allows (a non-contiguous or float64 momentum, an expanded gradient) steps as
the honest tensors do."""

from __future__ import annotations

import pytest
import torch
from optcore_lion import Lion

from optcore import StepError
from optcore.testing import BAD_STEP_INPUTS, STEPPABLE_STEP_INPUTS, assert_step_refused, same

BACKENDS = {
    "kernel": {"fused": True},
    "auto": {},
    "pieces": {"fused": False, "foreach": False},
    "foreach": {"foreach": True},
    "compiled": {"compiled": True},
}


def _stepped(backend: dict, dtype: torch.dtype = torch.float32) -> tuple[Lion, list[torch.Tensor]]:
    torch._dynamo.reset()  # each case compiles its own shapes: no recompile limit across cases
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(8, 6, generator=gen).to(dtype).requires_grad_(), torch.randn(6, generator=gen).to(dtype)
              .requires_grad_()]
    opt = Lion(params, lr=1e-2, weight_decay=0.1, **backend)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        opt.step()
    return opt, params


@pytest.mark.parametrize("case", list(BAD_STEP_INPUTS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_tensor_no_backend_can_step_is_a_step_error_that_changes_nothing(backend, case):
    opt, params = _stepped(BACKENDS[backend])
    error = assert_step_refused(opt, params, BAD_STEP_INPUTS[case], params[0], opt.state[params[0]], case)
    assert "#0 of param group 0" in str(error) and error.param is not None


@pytest.mark.parametrize("case", list(STEPPABLE_STEP_INPUTS))
@pytest.mark.parametrize("backend", ["auto", "pieces", "foreach", "compiled"])
def test_what_the_maths_allows_steps_as_the_honest_tensors_do(backend, case):
    honest, honest_params = _stepped(BACKENDS[backend])
    spoiled, params = _stepped(BACKENDS[backend])
    STEPPABLE_STEP_INPUTS[case](params[0], spoiled.state[params[0]])
    if case == "expanded gradient":
        honest_params[0].grad = params[0].grad.clone()
    honest.step()
    spoiled.step()
    # the same signs, so the same parameters (computed in float64 with a float64 momentum, then
    # rounded: equal to the last bits); a momentum stepped by torch ops instead of the kernel (a
    # non-contiguous one) or in float64 rounds differently in its last bits
    if case == "float64 state":
        torch.testing.assert_close(params, honest_params)
    else:
        assert same([p.detach() for p in params], [p.detach() for p in honest_params])
    torch.testing.assert_close(spoiled.state[params[0]]["exp_avg"].float(), honest.state[honest_params[0]]["exp_avg"])


def test_an_integer_momentum_is_refused_by_name_and_half_parameters_keep_float32_momentum():
    opt, params = _stepped({})
    error = assert_step_refused(opt, params, lambda p, s: s.__setitem__("exp_avg", s["exp_avg"].long()), params[0],
                                opt.state[params[0]], "an integer momentum")
    assert "'exp_avg'" in str(error) and "torch.int64" in str(error) and ".float()" in str(error)
    half, half_params = _stepped({}, torch.float16)
    assert half.state[half_params[0]]["exp_avg"].dtype == torch.float32
    half_params[0].grad = torch.ones_like(half_params[0])
    half.step()  # float32 state of a float16 parameter is what Lion keeps: not refused


def test_the_kernels_own_refusal_under_fused_true_is_still_a_step_error():
    """A float64 gradient is stepped by torch ops, but fused=True promises the C kernel."""
    opt, params = _stepped({"fused": True})
    with pytest.raises(StepError, match="fused=True"):
        params[0].grad.data = params[0].grad.data.double()
        opt.step()
