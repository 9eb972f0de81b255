"""The precision wrappers refuse what their inner step cannot use with a
StepError before anything changes (the model's parameters, the fp32 master
copy, the inner state and step counts, the loss scale), on every backend of
the inner optimizer: FP16Optimizer around torch's AdamW (fused, foreach, one
tensor at a time; flat and per-tensor masters) and MemoryEfficientFP16Optimizer
around Lion (torch ops in pieces, foreach, compiled)."""

from __future__ import annotations

import warnings

import pytest
import torch

import optcore
from optcore.testing import BAD_STEP_INPUTS, assert_step_refused

ADAMW = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "single": {"foreach": False},
    "fused-per-tensor": {"fused": True, "flat": False},
    "single-per-tensor": {"foreach": False, "flat": False},
}
LION = {"pieces": {}, "foreach": {"foreach": True}, "compiled": {"compiled": True}}


def _build(wrapper: str, backend: dict):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(8, 6, generator=gen).half().requires_grad_(), torch.randn(6, generator=gen).half()
              .requires_grad_()]
    backend = dict(backend)
    if wrapper == "FP16Optimizer":
        config = {"type": "optcore-fp16:FP16Optimizer", "flat": backend.pop("flat", None),
                  "optimizer": {"type": "torch:AdamW", "lr": 1e-2, **backend}}
    else:
        config = {"type": "optcore-fp16:MemoryEfficientFP16Optimizer",
                  "optimizer": {"type": "optcore-lion:Lion", "lr": 1e-2, **backend}}
    opt = optcore.build_optimizer(config, params)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).half()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gradients not made by opt.backward: unscaled
            opt.step()
    return opt, params


def _stepped_tensors(opt, params):
    """What the inner optimizer steps for the first parameter, and every tensor that must not change."""
    inner = opt.optimizer
    stepped = [t for g in inner.param_groups for t in g["params"]]
    first = stepped[0]
    return first, [*params, *stepped]


CASES = [(w, b, c) for w, backends in (("FP16Optimizer", ADAMW), ("MemoryEfficientFP16Optimizer", LION))
         for b in backends for c in BAD_STEP_INPUTS]


@pytest.mark.parametrize(("wrapper", "backend", "case"), CASES)
def test_a_tensor_the_inner_step_cannot_use_is_a_step_error_that_changes_nothing(wrapper, backend, case):
    opt, params = _build(wrapper, (ADAMW if wrapper == "FP16Optimizer" else LION)[backend])
    first, tensors = _stepped_tensors(opt, params)
    grad_case = "gradient" in case
    target = params[0] if grad_case else first  # gradients are the model's, state the inner optimizer's
    steps = [s.get("step") for s in opt.optimizer.state.values()]
    scale = opt.loss_scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        error = assert_step_refused(opt, tensors, BAD_STEP_INPUTS[case], target, opt.optimizer.state[first], case)
    assert isinstance(error, optcore.StepError)
    assert [s.get("step") for s in opt.optimizer.state.values()] == steps and opt.loss_scale == scale


@pytest.mark.parametrize("wrapper", ["FP16Optimizer", "MemoryEfficientFP16Optimizer"])
def test_an_expanded_gradient_steps_as_its_values(wrapper):
    """The overflow check writes the gradients it reads (torch's AMP kernel): an
    expanded one, which it cannot write, is checked through a copy."""
    honest, honest_params = _build(wrapper, {})
    spoiled, params = _build(wrapper, {})
    params[0].grad = params[0].grad[0, 0].expand(params[0].shape)
    honest_params[0].grad = params[0].grad.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        honest.step()
        spoiled.step()
    assert all(torch.equal(a, b) for a, b in zip(params, honest_params))
