"""optcore.guards' step-input checks: which gradients and state tensors no
backend can step, exactly (the overlap test against every element's offset),
and a fuzzer over crafted tensors handed to a native optimizer's step: only
StepErrors escape, and a refused step changes nothing."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optcore import OptcoreError, StepError
from optcore.guards import grad_problem, overlaps_itself, state_problem
from optcore.plugin import Optimizer, prepare_step
from optcore.testing import same, snapshot


def _brute_overlap(t: torch.Tensor) -> bool:
    offsets = [sum(i * s for i, s in zip(index, t.stride())) for index in torch.cartesian_prod(
        *[torch.arange(n) for n in t.shape]).reshape(-1, t.dim()).tolist()] if t.numel() else []
    return len(set(offsets)) != len(offsets)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 7)), min_size=1, max_size=3))
def test_overlaps_itself_is_exact(dims):
    shape, strides = [n for n, _ in dims], [s for _, s in dims]
    base = torch.zeros(1 + sum((n - 1) * s for n, s in dims))
    t = base.as_strided(shape, strides)
    assert overlaps_itself(t) == _brute_overlap(t)


def test_what_no_backend_can_step_and_what_it_can():
    p = torch.zeros(4, 3)
    assert grad_problem(p, torch.zeros(4, 3)) is None
    assert grad_problem(p, torch.zeros(4, 3, dtype=torch.float64)) is None  # each backend computes in its dtype
    assert "has shape (12,)" in grad_problem(p, torch.zeros(12))
    assert "torch.int64" in grad_problem(p, torch.zeros(4, 3, dtype=torch.int64))
    assert state_problem("m", torch.zeros(3, 4).t(), p) is None  # non-contiguous: torch ops step it
    assert "share memory" in state_problem("m", torch.zeros(1, 1).expand(4, 3), p)
    assert "meta" in state_problem("m", torch.zeros(4, 3, device="meta"), p)
    assert state_problem("m", torch.zeros(4, 3, dtype=torch.int8), p) is None  # "any": the optimizer's to judge
    assert ".float()" in state_problem("m", torch.zeros(4, 3, dtype=torch.int8), p, "floating")
    assert state_problem("m", torch.zeros(4, 3, dtype=torch.float64), p, "floating") is None
    assert "torch.float32" in state_problem("m", torch.zeros(4, 3, dtype=torch.float64), p, "param")


class _Momentum(Optimizer):
    """A native optimizer with one elementwise momentum, stepped by torch ops."""

    state_shapes = "elementwise"

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self, closure=None, scale=1.0, groups=None):
        prepared = prepare_step(self, closure, scale, groups, state_kind="floating")
        for _, group, _, p in prepared.params():
            m = self.state[p].setdefault("m", torch.zeros_like(p))
            m.mul_(0.9).add_(p.grad)
            p.add_(m, alpha=-group["lr"])
        return prepared.loss


_DTYPES = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64, torch.bool])


@st.composite
def _crafted(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    which = draw(st.sampled_from(["grad", "state"]))
    dims = [(draw(st.integers(1, 4)), draw(st.integers(0, 5))) for _ in range(draw(st.integers(1, 3)))]
    base = torch.arange(1 + sum((n - 1) * s for n, s in dims), dtype=torch.float32)
    t = base.as_strided([n for n, _ in dims], [s for _, s in dims]).to(draw(_DTYPES))
    if draw(st.booleans()):
        t = t.to("meta")
    return shape, which, t


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_crafted())
def test_a_crafted_gradient_or_state_is_stepped_or_refused_with_nothing_changed(crafted):
    shape, which, t = crafted
    p = torch.ones(shape, requires_grad=True)
    opt = _Momentum([p])
    p.grad = torch.ones(shape)
    opt.step()
    try:
        if which == "grad":
            p.grad.data = t
        else:
            opt.state[p]["m"] = t
    except RuntimeError:
        return  # torch refuses this one itself (.data of another device or type)
    before = snapshot(opt, [p])
    try:
        opt.step()
    except StepError:
        assert same(before, snapshot(opt, [p]))
    except OptcoreError as exc:  # pragma: no cover - a failure
        raise AssertionError(f"a step refusal that is not a StepError: {exc!r}") from exc
