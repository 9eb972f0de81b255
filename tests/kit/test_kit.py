"""The conformance kit itself (optcore.testing): its one training loop, the
dtype cases plugins parametrise over, and that its checks still fail broken
optimizers."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from optcore.testing import CHECKS, ConformanceInputs, conformance_cases, run_check, run_conformance
from optcore.testing._fixtures import build, data, loss, model, train


class SkipsLowPrecision(torch.optim.SGD):
    """Declares bf16 but leaves bf16/fp16 parameters as they are: a bug only a
    run in bf16 parameters can see."""

    conformance_inputs: ClassVar[dict] = {"config": {"lr": 0.05}, "dtypes": ("float32", "bfloat16")}

    @torch.no_grad()
    def step(self, closure=None):
        kept = [(p, p.clone()) for g in self.param_groups for p in g["params"] if p.dtype.itemsize < 4]
        value = super().step(closure)
        for p, before in kept:
            p.copy_(before)
        return value


class MovesFrozen(torch.optim.SGD):
    """Nudges parameters that have no gradient (what check_none_grads catches)."""

    @torch.no_grad()
    def step(self, closure=None):
        value = super().step(closure)
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    p.add_(1e-3)
        return value


def test_train_with_a_fixed_batch_returns_the_loss_before_each_step() -> None:
    """check_converges runs on train(batch=...): its losses are those of a plain loop."""
    inputs = ConformanceInputs()
    config = {"type": "SGD", "lr": 0.05}
    m = model(inputs)
    batch = data(0)
    seen = train(build(config, m), m, 4, inputs, batch=batch)
    ref = model(inputs)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    expected = []
    for _ in range(4):
        opt.zero_grad()
        value = loss(ref, batch)
        value.backward()
        opt.step()
        expected.append(float(value.detach()))
    assert seen == expected


class MovesNothing(torch.optim.SGD):
    @torch.no_grad()
    def step(self, closure=None):
        return closure() if closure is not None else None


def test_converges_fails_an_optimizer_that_does_not_learn() -> None:
    run_check("converges", {"type": "SGD", "lr": 0.05})
    with pytest.raises(AssertionError, match="loss fell only from"):
        run_check("converges", {"type": MovesNothing}, inputs=ConformanceInputs(converge_steps=10))


def test_conformance_cases_are_every_check_in_every_declared_dtype() -> None:
    cases = conformance_cases({"type": SkipsLowPrecision})
    assert [c.values for c in cases] == [(c, d) for d in ("float32", "bfloat16") for c in CHECKS]
    assert cases[0].id == "contract-float32" and not cases[0].marks
    assert [c.values for c in conformance_cases("SGD", checks=["converges"])] == [
        ("converges", d) for d in ("float32", "float64", "bfloat16")  # optcore's table for torch's SGD
    ]


def test_conformance_cases_mark_known_failures_as_strict_xfails() -> None:
    cases = conformance_cases({"type": SkipsLowPrecision}, xfail={("converges", "bfloat16"): "upstream bug"})
    marked = [c for c in cases if c.marks]
    assert [c.values for c in marked] == [("converges", "bfloat16")]
    assert marked[0].marks[0].kwargs["strict"] is True
    with pytest.raises(ValueError, match="float64"):  # a dtype the class does not declare
        conformance_cases({"type": SkipsLowPrecision}, xfail={("converges", "float64"): "?"})
    with pytest.raises(ValueError, match="unknown checks"):
        conformance_cases({"type": SkipsLowPrecision}, checks=["converge"])


def test_a_bug_in_a_declared_low_precision_dtype_fails_that_case_only() -> None:
    """The dtype a case names is the parameters' dtype; torch's default dtype is not
    read, so a test that sets it and names no dtype runs fp32 only."""
    outcomes = {}
    for case in conformance_cases({"type": SkipsLowPrecision}, checks=["converges"]):
        check, dtype = case.values
        try:
            run_check(check, {"type": SkipsLowPrecision}, dtype=dtype)
            outcomes[dtype] = "passed"
        except AssertionError as exc:
            outcomes[dtype] = str(exc)
    assert outcomes["float32"] == "passed"
    assert "bfloat16] conformance check 'converges' failed" in outcomes["bfloat16"]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:  # default dtype set, no dtype given: an fp32 run, which passes
        run_check("converges", {"type": SkipsLowPrecision})
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("plugin", ["optcore_lion:Lion", "optcore_fp16:FP16Optimizer", "optcore_adafactor:Adafactor"])
def test_plugins_declare_the_low_precision_dtypes_their_kit_tests_run(plugin: str) -> None:
    pytest.importorskip(plugin.split(":")[0])
    dtypes = {c.values[1] for c in conformance_cases({"type": plugin})}
    assert "bfloat16" in dtypes


def test_run_conformance_goes_on_after_a_skipped_check() -> None:
    """A skipped check does not end the run: the checks after it run, and the
    skips are returned."""
    inputs = ConformanceInputs(config={"lr": 0.05}, skip={"closure": "not this one"})
    skipped = run_conformance({"type": "SGD"}, inputs, checks=["closure", "none_grads"], dtypes=["float32"])
    assert skipped == [("closure", "float32", "not this one")]
    with pytest.raises(AssertionError, match="none_grads"):
        run_conformance({"type": MovesFrozen}, inputs, checks=["closure", "none_grads"], dtypes=["float32"])
