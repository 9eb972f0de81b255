"""The shared conformance kit: one set of checks every optimizer runs through.

Like torch's ``OptimizerInfo`` tests, the checks are generic and the
per-optimizer differences are *data*: a :class:`ConformanceInputs` record
(taken from the class's ``conformance_inputs`` attribute, optcore's table for
``torch.optim``, or given by the caller). Plugins use it from their own tests::

    import pytest
    from optcore.testing import CHECKS, run_check

    @pytest.mark.parametrize("check", CHECKS)
    def test_conformance(check):
        run_check(check, {"type": "optcore-lion:Lion", "lr": 1e-3})

Each check builds fresh small models with a fixed seed and raises
``AssertionError`` with the optimizer and check named.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

__all__ = ["CHECKS", "ConformanceInputs", "inputs_for", "run_check", "run_conformance"]


@dataclass(frozen=True)
class ConformanceInputs:
    """What a check needs to know about an optimizer."""

    #: hyper-parameters to add to the config for the checks (e.g. a usable lr)
    config: dict[str, Any] = field(default_factory=dict)
    #: the optimizer evaluates the closure itself, several times (LBFGS)
    needs_closure: bool = False
    #: only 2-D parameters (Muon)
    matrices_only: bool = False
    #: steps for the convergence check, and the loss ratio it must reach
    converge_steps: int = 150
    converge_ratio: float = 0.5
    #: absolute tolerance for "same result" comparisons
    atol: float = 1e-6
    #: checks to skip, with the reason (shown as the skip message)
    skip: dict[str, str] = field(default_factory=dict)


_TORCH_INPUTS: dict[str, ConformanceInputs] = {
    "LBFGS": ConformanceInputs(needs_closure=True, config={"line_search_fn": "strong_wolfe"}, skip={"step_with_scale": "LBFGS re-evaluates the closure",
                                                         "groups": "LBFGS supports one param group"}),
    "SparseAdam": ConformanceInputs(skip={"*": "SparseAdam takes sparse gradients only"}),
    "Muon": ConformanceInputs(matrices_only=True, config={"lr": 0.02}),
    "Adadelta": ConformanceInputs(config={"lr": 1.0}, converge_steps=300),
    "ASGD": ConformanceInputs(config={"lr": 0.05}),
    "SGD": ConformanceInputs(config={"lr": 0.05, "momentum": 0.9}),
    "Rprop": ConformanceInputs(config={"lr": 0.01}),
}


#: Inputs for third-party classes, keyed by qualified name (data, like the torch table).
_PACKAGE_INPUTS: dict[str, ConformanceInputs] = {
    "transformers.optimization:Adafactor": ConformanceInputs(
        config={"lr": 1e-2, "relative_step": False, "scale_parameter": False, "warmup_init": False}
    ),
    "pytorch_optimizer:DAdaptLion": ConformanceInputs(config={"lr": 1.0}),
    "pytorch_optimizer:DAdaptSGD": ConformanceInputs(config={"lr": 1.0}),
    "pytorch_optimizer:DAdaptAdam": ConformanceInputs(config={"lr": 1.0}),
    "pytorch_optimizer:Prodigy": ConformanceInputs(config={"lr": 1.0}),
}


def inputs_for(spec: Any) -> ConformanceInputs:
    """The conformance inputs of a resolved spec."""
    declared = getattr(spec.target, "conformance_inputs", None)
    if isinstance(declared, ConformanceInputs):
        return declared
    if isinstance(declared, dict):
        return ConformanceInputs(**declared)
    if spec.source == "torch" and spec.name in _TORCH_INPUTS:
        return _TORCH_INPUTS[spec.name]
    if spec.qualified in _PACKAGE_INPUTS:
        return _PACKAGE_INPUTS[spec.qualified]
    field_info = getattr(spec.schema, "model_fields", {}).get("lr")
    if field_info is not None and field_info.is_required():
        return ConformanceInputs(config={"lr": 1e-3})  # classes without a default lr
    return ConformanceInputs()


# ----------------------------------------------------------------- fixtures
class _Net(nn.Module):
    def __init__(self, matrices_only: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8, bias=not matrices_only)
        self.fc2 = nn.Linear(8, 3, bias=not matrices_only)
        self.norm = None if matrices_only else nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if self.norm is not None:
            h = self.norm(h)
        return self.fc2(h)


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 6, generator=g)
    w = torch.randn(6, 3, generator=g)
    return x, torch.tanh(x @ w)


def _model(inputs: ConformanceInputs, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return _Net(inputs.matrices_only)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _config(config: Any, inputs: ConformanceInputs) -> dict[str, Any]:
    from .._config import optimizer_config

    cfg = optimizer_config(config)
    return {**inputs.config, **cfg}


def _build(config: dict[str, Any], model: nn.Module) -> Any:
    from .._build import build_optimizer

    return build_optimizer(copy.deepcopy(config), model)


def _train(opt: Any, model: nn.Module, steps: int, inputs: ConformanceInputs, seed: int = 1, **step_kwargs: Any) -> list[float]:
    losses = []
    for i in range(steps):
        batch = _data(seed + i)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = _loss(model, batch)
            opt.backward(loss)
            return loss

        if inputs.needs_closure:
            loss = opt.step(closure)
        else:
            loss = closure()
            opt.step(**step_kwargs)
        losses.append(float(loss.detach()))
    return losses


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        if not torch.allclose(x, y, atol=atol, rtol=max(atol, 1e-5)):
            raise AssertionError(f"{what}: parameter {i} differs by {(x - y).abs().max().item():.3g} (atol {atol})")


# -------------------------------------------------------------------- checks
def check_contract(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """The object is a torch Optimizer with every member API.md lists."""
    model = _model(inputs)
    opt = _build(config, model)
    assert isinstance(opt, torch.optim.Optimizer), f"{type(opt)} is not a torch.optim.Optimizer"
    for flag in ("supports_memory_efficient_fp16", "supports_step_with_scale", "supports_flat_params", "supports_groups"):
        assert isinstance(getattr(opt, flag), bool), f"{flag} is not a bool"
    for member in ("get_lr", "set_lr", "backward", "multiply_grads", "clip_grad_norm", "average_params"):
        assert callable(getattr(opt, member, None)), f"missing {member}()"
    assert isinstance(opt.optimizer_config, dict)
    lr = opt.get_lr()
    opt.set_lr(lr * 0.5)
    assert math.isclose(opt.get_lr(), lr * 0.5, rel_tol=1e-9, abs_tol=1e-12), "set_lr/get_lr do not round-trip"
    opt.average_params()  # no-op without torch.distributed


def check_grad_ops(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """multiply_grads scales the gradients; clip_grad_norm returns the true total
    norm and clips to max_norm. Judged through clip_grad_norm(0) (which only
    measures), so wrappers that keep a pending factor (loss scaling) are held to
    the same contract; plain optimizers are also checked on ``p.grad``."""
    twin = _model(inputs)
    _loss(twin, _data()).backward()
    true_grads = [p.grad for p in twin.parameters()]
    expected = torch.linalg.vector_norm(torch.stack([g.norm() for g in true_grads]))
    model = _model(inputs)
    opt = _build(config, model)
    opt.backward(_loss(model, _data()))
    plain = not getattr(opt, "wraps_optimizer", False)
    norm = opt.clip_grad_norm(0.0)
    assert torch.allclose(norm.float(), expected, rtol=1e-4), f"clip_grad_norm(0) = {norm}, true norm {expected}"
    opt.multiply_grads(2.0)
    doubled = opt.clip_grad_norm(0.0)
    assert torch.allclose(doubled.float(), 2 * expected, rtol=1e-4), "multiply_grads(2) did not double the gradients"
    if plain:
        for g, p in zip(true_grads, model.parameters()):
            assert torch.allclose(p.grad, 2 * g, rtol=1e-5, atol=1e-7), "multiply_grads(2) did not double p.grad"
    total = opt.clip_grad_norm(0.1 * float(expected))
    assert torch.allclose(total.float(), 2 * expected, rtol=1e-4), "clip_grad_norm must return the norm before clipping"
    after = opt.clip_grad_norm(0.0)
    assert after <= 0.1 * float(expected) * 1.001, f"after clipping the norm is {after}, above max_norm"


def check_state_dict_roundtrip(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """Save mid-run through torch.save / torch.load(weights_only=True), resume in
    a fresh optimizer: the trajectory equals the uninterrupted run."""
    model_a = _model(inputs)
    opt_a = _build(config, model_a)
    _train(opt_a, model_a, 5, inputs)
    buf = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "optim": opt_a.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model_b = _model(inputs, seed=123)
    model_b.load_state_dict(ckpt["model"])
    opt_b = _build(config, model_b)
    opt_b.load_state_dict(ckpt["optim"])
    _train(opt_a, model_a, 5, inputs, seed=50)
    _train(opt_b, model_b, 5, inputs, seed=50)
    _assert_same(_params(model_a), _params(model_b), inputs.atol, "resumed run diverged")


def check_step_with_scale(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """step(scale=s) on grads multiplied by s equals step() on the plain grads."""
    model_a, model_b = _model(inputs), _model(inputs)
    opt_a, opt_b = _build(config, model_a), _build(config, model_b)
    for i in range(3):
        for model, opt, s in ((model_a, opt_a, 1.0), (model_b, opt_b, 64.0)):
            opt.zero_grad()
            opt.backward(_loss(model, _data(i)) * s)
            opt.step(scale=s) if s != 1.0 else opt.step()
    _assert_same(_params(model_a), _params(model_b), max(inputs.atol, 1e-5), "step(scale=64) on scaled grads")


def check_closure(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """step(closure) returns the closure's loss and updates like a plain step."""
    model_a, model_b = _model(inputs), _model(inputs)
    opt_a, opt_b = _build(config, model_a), _build(config, model_b)
    batch = _data()

    def closure() -> torch.Tensor:
        opt_a.zero_grad()
        loss = _loss(model_a, batch)
        opt_a.backward(loss)
        return loss

    loss = opt_a.step(closure)
    assert loss is not None and torch.isfinite(torch.as_tensor(loss)), "step(closure) must return the loss"
    if not inputs.needs_closure:
        opt_b.zero_grad()
        opt_b.backward(_loss(model_b, batch))
        opt_b.step()
        _assert_same(_params(model_a), _params(model_b), inputs.atol, "step(closure) vs step()")


def check_groups(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """Per-group hyper-parameters apply, and step(groups=...) touches only those groups."""
    model = _model(inputs)
    cfg = dict(config, param_groups=[{"params": r"^fc2\.", "name": "head", "lr_scale": 0.5}])
    opt = _build(cfg, model)
    names = [g.get("name") for g in opt.param_groups]
    assert "head" in names, f"named group missing: {names}"
    if not opt.supports_groups:
        return
    head_ids = {id(p) for p in opt.param_groups[names.index("head")]["params"]}
    model_all = _model(inputs)
    opt_all = _build(cfg, model_all)
    for m, o in ((model, opt), (model_all, opt_all)):  # a first full step (ADOPT only initialises on it)
        o.zero_grad()
        o.backward(_loss(m, _data(0)))
        o.step()
    before = _params(model)
    for m, o, kwargs in ((model, opt, {"groups": ["head"]}), (model_all, opt_all, {})):
        o.zero_grad()
        o.backward(_loss(m, _data(1)))
        o.step(**kwargs)
    for p, p_all, p0 in zip(model.parameters(), model_all.parameters(), before):
        if id(p) in head_ids:
            _assert_same([p.detach()], [p_all.detach()], inputs.atol, "a selected group stepped unlike a full step")
        else:
            assert torch.equal(p0, p.detach()), "step(groups=['head']) changed a parameter outside the group"


def check_none_grads(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """Parameters whose grad is None are left alone, without error."""
    model = _model(inputs)
    opt = _build(config, model)
    frozen_before = model.fc2.weight.detach().clone()
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss = _loss(model, _data())
        opt.backward(loss)
        model.fc2.weight.grad = None
        if inputs.needs_closure:
            opt.step(lambda: loss)
        else:
            opt.step()
    assert torch.equal(frozen_before, model.fc2.weight.detach()), "a parameter without grad was changed"


def check_lr_scheduler(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """torch's LR schedulers drive the optimizer (and the contract's get_lr follows)."""
    import warnings

    model = _model(inputs)
    opt = _build(config, model)
    base = opt.get_lr()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. "scheduler.step() before optimizer.step()"
        _train(opt, model, 1, inputs)
        sched.step()
    assert math.isclose(opt.get_lr(), base / 2, rel_tol=1e-6), f"get_lr() = {opt.get_lr()}, expected {base / 2}"
    state = sched.state_dict()
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    sched2.load_state_dict(state)


def check_deepcopy(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """A deep copy (model and optimizer together) is independent of the original."""
    model = _model(inputs)
    opt = _build(config, model)
    _train(opt, model, 2, inputs)
    model2, opt2 = copy.deepcopy((model, opt))
    before = _params(model)
    _train(opt2, model2, 2, inputs)
    _assert_same(before, _params(model), 0.0, "stepping the copy changed the original")
    _train(opt, model, 2, inputs)
    _assert_same(_params(model), _params(model2), inputs.atol, "the copy does not continue like the original")


def check_converges(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    """On a small regression problem the loss falls, at the configured learning
    rate or, where the inputs set none, at one of 1e-3, 1e-2, 1e-1 (defaults
    such as Lion's 1e-4 are meant for long runs, not 150 steps)."""
    failures = []
    for lr in dict.fromkeys([config.get("lr"), 1e-3, 1e-2, 1e-1]):
        try:
            return _converges(config if lr is None else {**config, "lr": lr}, inputs)
        except AssertionError as exc:
            failures.append(f"lr={lr}: {exc}")
    raise AssertionError("; ".join(failures))


def _converges(config: dict[str, Any], inputs: ConformanceInputs) -> None:
    model = _model(inputs)
    opt = _build(config, model)
    batch = _data(0)
    first = float(_loss(model, batch).detach())
    losses = []
    for _ in range(inputs.converge_steps):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = _loss(model, batch)
            opt.backward(loss)
            return loss

        if inputs.needs_closure:
            opt.step(closure)
        else:
            closure()
            opt.step()
        losses.append(float(_loss(model, batch).detach()))
    assert all(math.isfinite(v) for v in losses), "loss became non-finite"
    assert min(losses) < inputs.converge_ratio * first, (
        f"loss fell only from {first:.4g} to {min(losses):.4g} in {inputs.converge_steps} steps"
    )


CHECKS: dict[str, Callable[[dict[str, Any], ConformanceInputs], None]] = {
    "contract": check_contract,
    "grad_ops": check_grad_ops,
    "state_dict_roundtrip": check_state_dict_roundtrip,
    "step_with_scale": check_step_with_scale,
    "closure": check_closure,
    "groups": check_groups,
    "none_grads": check_none_grads,
    "lr_scheduler": check_lr_scheduler,
    "deepcopy": check_deepcopy,
    "converges": check_converges,
}


class ConformanceSkip(Exception):
    """Raised by :func:`run_check` for a check the inputs say to skip."""


def run_check(name: str, config: Any, inputs: ConformanceInputs | None = None) -> None:
    """Run one check on ``config``; under pytest a declared skip becomes a skip."""
    from .._config import optimizer_config
    from .._registry import resolve

    cfg = optimizer_config(config)
    spec = resolve(cfg["type"])
    inputs = inputs or inputs_for(spec)
    reason = inputs.skip.get(name) or inputs.skip.get("*")
    if reason:
        try:
            import pytest

            pytest.skip(reason)
        except ImportError:  # pragma: no cover
            raise ConformanceSkip(reason) from None
    full = _config(cfg, inputs)
    try:
        CHECKS[name](full, inputs)
    except AssertionError as exc:
        raise AssertionError(f"[{spec.qualified}] conformance check {name!r} failed: {exc}") from None


def run_conformance(config: Any, inputs: ConformanceInputs | None = None, checks: list[str] | None = None) -> None:
    """Run every check (or ``checks``) on ``config``; raise on the first failure."""
    for name in checks or list(CHECKS):
        run_check(name, config, inputs)


def with_config(inputs: ConformanceInputs, **config: Any) -> ConformanceInputs:
    """``inputs`` with extra config keys."""
    return replace(inputs, config={**inputs.config, **config})
