"""The wrappers' step under torch.compile: traced,
no graph break beyond what torch's own GradScaler step has (the host sync that
decides to skip an overflowing step), and the same result as eager. Counted
with dynamo's counters, never timed."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from fp16_helpers import HalfSGD, data, loss_fn, mlp, poison
from optcore_fp16 import FP16Optimizer, MemoryEfficientFP16Optimizer
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

WRAPPERS = {"FP16Optimizer": FP16Optimizer, "MemoryEfficientFP16Optimizer": MemoryEfficientFP16Optimizer}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _breaks() -> set[str]:
    """The distinct graph-break reasons seen (each recompile meets a break again)."""
    return {reason.splitlines()[0] for reason in counters["graph_break"]}


def _run(wrapper, precision, compiled, steps=4, poisoned=()):
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    model = mlp(dtype)
    opt = wrapper(HalfSGD(model.parameters(), lr=1e-2), precision=precision)
    x, y = data()
    step = torch.compile(lambda: opt.step(), backend=CompileCounter()) if compiled else opt.step
    for i in range(steps):
        opt.zero_grad()
        opt.backward(loss_fn(model, x, y))
        if i in poisoned:
            poison(model, "inf")
        step()
    return model, opt


def _grad_scaler_breaks() -> set[str]:
    """torch.amp.GradScaler + AdamW, the step compiled the same way: the baseline."""
    model = mlp(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    scaler = torch.amp.GradScaler("cpu")
    x, y = data()

    def step():
        scaler.step(opt)
        scaler.update()

    compiled = torch.compile(step, backend=CompileCounter())
    for _ in range(3):
        opt.zero_grad()
        scaler.scale(loss_fn(model, x, y)).backward()
        compiled()
    breaks = _breaks()
    counters.clear()
    torch._dynamo.reset()
    return breaks


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("wrapper", WRAPPERS.values(), ids=WRAPPERS)
def test_compiled_wrapper_step_matches_eager_with_no_extra_graph_break(wrapper, precision):
    baseline = _grad_scaler_breaks()
    compiled_model, _ = _run(wrapper, precision, compiled=True, poisoned={2})
    breaks = _breaks()
    eager_model, eager_opt = _run(wrapper, precision, compiled=False, poisoned={2})
    if precision == "bf16":
        assert not breaks, breaks  # no loss scaler: nothing to sync on
    else:  # one: the host sync that decides whether to skip, as GradScaler's step has
        assert len(breaks) == 1 and "Tensor.item()" in next(iter(breaks)), breaks
        assert len(breaks) <= len(baseline), (breaks, baseline)
    assert eager_opt.skipped_steps == (1 if precision == "fp16" else 0)
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
