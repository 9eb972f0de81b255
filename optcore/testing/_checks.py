"""The checks: each one property API.md promises, judged on the kit's problem.

A check is ``check(config, inputs, dtype=torch.float32)``: ``config`` is the
full optimizer config (the inputs' ``config`` merged in), ``inputs`` the
optimizer's :class:`~optcore.testing.ConformanceInputs`, ``dtype`` the
parameters' dtype. It raises ``AssertionError`` saying what differs. Checks are
generic: what an optimizer does differently is data on its inputs, never a name
tested here. :data:`CHECKS` maps each check's name to it, in running order.
"""

from __future__ import annotations

import copy
import io
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .._contract import LR_SCHEDULES
from ._fixtures import assert_same, build, data, dtype_of, loss, model, params, train
from ._inputs import ConformanceInputs

F32 = torch.float32


def check_contract(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """The object is a torch Optimizer with every member API.md lists."""
    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    assert isinstance(opt, torch.optim.Optimizer), f"{type(opt)} is not a torch.optim.Optimizer"
    for flag in ("supports_memory_efficient_fp16", "supports_step_with_scale", "supports_flat_params", "supports_groups"):
        assert isinstance(getattr(opt, flag), bool), f"{flag} is not a bool"
    assert opt.lr_schedule in LR_SCHEDULES, f"lr_schedule is {opt.lr_schedule!r}, not one of {LR_SCHEDULES}"
    for member in ("get_lr", "set_lr", "backward", "multiply_grads", "clip_grad_norm", "average_params"):
        assert callable(getattr(opt, member, None)), f"missing {member}()"
    assert isinstance(opt.optimizer_config, dict)
    lr = opt.get_lr()
    opt.set_lr(lr * 0.5)
    assert math.isclose(opt.get_lr(), lr * 0.5, rel_tol=1e-9, abs_tol=1e-12), "set_lr/get_lr do not round-trip"
    opt.average_params()  # no-op without torch.distributed


def check_grad_ops(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """multiply_grads scales the gradients; clip_grad_norm returns the true total
    norm (in at least fp32, and in the grads' precision when higher) and clips to
    max_norm. Judged through clip_grad_norm(0) (which only measures), so wrappers
    that keep a pending factor (loss scaling) are held to the same contract;
    plain optimizers are also checked on ``p.grad``."""
    twin = model(inputs, dtype=dtype)
    loss(twin, data(0, dtype)).backward()
    true_grads = [p.grad for p in twin.parameters()]
    expected = torch.linalg.vector_norm(torch.stack([g.double().norm() for g in true_grads]))
    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    opt.backward(loss(m, data(0, dtype)))
    plain = not getattr(opt, "wraps_optimizer", False)
    norm = opt.clip_grad_norm(0.0)
    want_dtype = torch.promote_types(dtype, torch.float32)
    if plain:
        assert norm.dtype == want_dtype, f"clip_grad_norm of {dtype} grads is {norm.dtype}, expected {want_dtype}"
    assert torch.allclose(norm.double(), expected, rtol=1e-4), f"clip_grad_norm(0) = {norm}, true norm {expected}"
    opt.multiply_grads(2.0)
    doubled = opt.clip_grad_norm(0.0)
    assert torch.allclose(doubled.double(), 2 * expected, rtol=1e-4), "multiply_grads(2) did not double the gradients"
    if plain:
        for g, p in zip(true_grads, m.parameters()):
            assert torch.allclose(p.grad, 2 * g, rtol=1e-5, atol=1e-7), "multiply_grads(2) did not double p.grad"
    total = opt.clip_grad_norm(0.1 * float(expected))
    assert torch.allclose(total.double(), 2 * expected, rtol=1e-4), "clip_grad_norm must return the norm before clipping"
    after = opt.clip_grad_norm(0.0)
    slack = 1.001 if dtype in (torch.float32, torch.float64) else 1.02  # clipped grads are rounded to dtype
    assert after <= 0.1 * float(expected) * slack, f"after clipping the norm is {after}, above max_norm"


def check_state_dict_roundtrip(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """Save mid-run through torch.save / torch.load(weights_only=True), resume in
    a fresh optimizer: the trajectory equals the uninterrupted run."""
    model_a = model(inputs, dtype=dtype)
    opt_a = build(config, model_a)
    train(opt_a, model_a, 5, inputs)
    buf = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "optim": opt_a.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model_b = model(inputs, seed=123, dtype=dtype)
    model_b.load_state_dict(ckpt["model"])
    opt_b = build(config, model_b)
    opt_b.load_state_dict(ckpt["optim"])
    train(opt_a, model_a, 5, inputs, seed=50)
    train(opt_b, model_b, 5, inputs, seed=50)
    assert_same(params(model_a), params(model_b), inputs.atol_for(dtype), "resumed run diverged")


def _other_optimizer(record: dict[str, Any]) -> dict[str, Any]:
    """An optimizer that is not the one that saved ``record``."""
    if (record.get("provider"), record.get("name")) == ("torch", "SGD"):
        return {"type": "torch:Adam"}
    return {"type": "torch:SGD", "momentum": 0.9}


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    return a == b


def check_state_dict_checks(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """A state dict names the optimizer that saved it; loading it over parameters
    of other shapes, or into another optimizer, is a ConfigError that changes
    nothing; another version of the same optimizer loads with a warning; a plain
    torch state dict (no "optcore" entry) loads."""
    from .._errors import ConfigError

    model_a = model(inputs, dtype=dtype)
    opt_a = build(config, model_a)
    train(opt_a, model_a, 2, inputs)
    saved = opt_a.state_dict()
    spec = getattr(opt_a, "optcore_spec", None)
    record = saved.get("optcore")
    if spec is not None:
        assert isinstance(record, dict), "state_dict() has no 'optcore' record of the optimizer that saved it"
        got = {k: record.get(k) for k in ("name", "provider", "version")}
        want = {"name": spec.name, "provider": spec.provider, "version": None if spec.version is None else str(spec.version)}
        assert got == want, f"state_dict()['optcore'] is {got}, expected {want}"
    if not isinstance(record, dict) or not saved.get("state"):
        return  # nothing to mismatch: a wrapper's own format, or a stateless update
    # Parameters of other shapes, same count per group (Linear(6, 8) -> Linear(6, 16)).
    bigger = model(inputs, dtype=dtype, hidden=16)
    opt_b = build(config, bigger)
    state_before = copy.deepcopy(opt_b.state_dict()["state"])  # Adagrad fills its state in __init__
    try:
        opt_b.load_state_dict(copy.deepcopy(saved))
    except ConfigError as exc:
        assert "parameter" in str(exc), f"the shape error does not name the parameter: {exc}"
    else:
        raise AssertionError("state saved for other parameter shapes loaded without an error")
    assert _same_state(opt_b.state_dict()["state"], state_before), "a rejected state_dict changed the optimizer's state"
    train(opt_b, bigger, 1, inputs)  # and the optimizer still works
    # Another optimizer.
    twin = model(inputs, dtype=dtype)
    other = build(_other_optimizer(record), twin)
    try:
        other.load_state_dict(copy.deepcopy(saved))
    except ConfigError as exc:
        assert str(record["name"]) in str(exc), f"the error does not name the optimizer that saved the state: {exc}"
    else:
        raise AssertionError(f"{record['name']}'s state loaded into {type(other).__name__} without an error")
    # Another version of the same optimizer: a warning, then the same trajectory.
    for variant, expect_warning in (({**record, "version": "0.0.0+other"}, True), (None, False)):
        sd = {k: v for k, v in copy.deepcopy(saved).items() if k != "optcore"}
        if variant is not None:
            sd["optcore"] = variant
        model_c = copy.deepcopy(model_a)
        opt_c = build(config, model_c)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt_c.load_state_dict(sd)
        said = [str(w.message) for w in caught if "version" in str(w.message)]
        assert bool(said) == expect_warning, (
            f"loading state {'of another version' if expect_warning else 'without an optcore record'}: warnings {said}"
        )
        reference = copy.deepcopy(model_a)
        opt_ref = build(config, reference)
        opt_ref.load_state_dict(copy.deepcopy(saved))
        train(opt_c, model_c, 2, inputs, seed=40)
        train(opt_ref, reference, 2, inputs, seed=40)
        assert_same(params(model_c), params(reference), inputs.atol_for(dtype), "state loaded with a warning diverged")


def check_step_with_scale(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """step(scale=s) on grads multiplied by s equals step() on the plain grads."""
    model_a, model_b = model(inputs, dtype=dtype), model(inputs, dtype=dtype)
    opt_a, opt_b = build(config, model_a), build(config, model_b)
    for i in range(3):
        for m, opt, s in ((model_a, opt_a, 1.0), (model_b, opt_b, 64.0)):
            opt.zero_grad()
            opt.backward(loss(m, data(i, dtype)) * s)
            opt.step(scale=s) if s != 1.0 else opt.step()
    assert_same(params(model_a), params(model_b), max(inputs.atol_for(dtype), 1e-5), "step(scale=64) on scaled grads")


def check_closure(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """step(closure) returns the closure's loss and updates like a plain step."""
    model_a, model_b = model(inputs, dtype=dtype), model(inputs, dtype=dtype)
    opt_a, opt_b = build(config, model_a), build(config, model_b)
    batch = data(0, dtype)

    def closure() -> torch.Tensor:
        opt_a.zero_grad()
        value = loss(model_a, batch)
        opt_a.backward(value)
        return value

    value = opt_a.step(closure)
    assert value is not None and torch.isfinite(torch.as_tensor(value)), "step(closure) must return the loss"
    if not inputs.needs_closure:
        opt_b.zero_grad()
        opt_b.backward(loss(model_b, batch))
        opt_b.step()
        assert_same(params(model_a), params(model_b), inputs.atol_for(dtype), "step(closure) vs step()")


def check_groups(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """Per-group hyper-parameters apply, and step(groups=...) touches only those groups."""
    m = model(inputs, dtype=dtype)
    cfg = dict(config, param_groups=[{"params": r"^fc2\.", "name": "head", "lr_scale": 0.5}])
    opt = build(cfg, m)
    names = [g.get("name") for g in opt.param_groups]
    assert "head" in names, f"named group missing: {names}"
    if not opt.supports_groups:
        return
    # every group of the name: the regex's biases may be split off without decay
    head_ids = {id(p) for g in opt.param_groups if g.get("name") == "head" for p in g["params"]}
    assert head_ids == {id(p) for p in m.fc2.parameters()}, "the groups named 'head' are not what its regex matched"
    model_all = model(inputs, dtype=dtype)
    opt_all = build(cfg, model_all)
    for mm, o in ((m, opt), (model_all, opt_all)):  # a first full step (ADOPT only initialises on it)
        o.zero_grad()
        o.backward(loss(mm, data(0, dtype)))
        o.step()
    before = params(m)
    for mm, o, kwargs in ((m, opt, {"groups": ["head"]}), (model_all, opt_all, {})):
        o.zero_grad()
        o.backward(loss(mm, data(1, dtype)))
        o.step(**kwargs)
    for p, p_all, p0 in zip(m.parameters(), model_all.parameters(), before):
        if id(p) in head_ids:
            assert_same([p.detach()], [p_all.detach()], inputs.atol_for(dtype), "a selected group stepped unlike a full step")
        else:
            assert torch.equal(p0, p.detach()), "step(groups=['head']) changed a parameter outside the group"


def check_none_grads(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """Parameters whose grad is None are left alone, without error."""
    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    frozen_before = m.fc2.weight.detach().clone()
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        value = loss(m, data(0, dtype))
        opt.backward(value)
        m.fc2.weight.grad = None
        if inputs.needs_closure:
            opt.step(lambda: value)
        else:
            opt.step()
    assert torch.equal(frozen_before, m.fc2.weight.detach()), "a parameter without grad was changed"


def check_step_errors(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """Where the inputs say the step takes the contract's preamble: a sparse
    gradient, state of another shape than its parameter (a fused kernel would
    read past its end) and a scale that is not positive are each a StepError
    naming what is wrong, raised before any parameter or state changes."""
    if not inputs.step_errors:
        return
    from .._errors import StepError

    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    train(opt, m, 1, inputs)  # state exists
    state = next(s for s in opt.state.values() if any(isinstance(v, torch.Tensor) and v.dim() for v in s.values()))
    key = next(k for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim())
    kept = state[key]
    cases = {
        "a sparse gradient": ("sparse", lambda: setattr(m.fc2.weight, "grad", m.fc2.weight.grad.to_sparse())),
        f"state {key!r} of another shape": ("has shape", lambda: state.__setitem__(key, kept.new_zeros(kept.numel() + 3))),
        "scale=0": ("scale", lambda: None),
    }
    for what, (words, spoil) in cases.items():
        opt.zero_grad()
        opt.backward(loss(m, data(1, dtype)))
        before, saved = params(m), copy.deepcopy(opt.state_dict()["state"])
        spoil()
        try:
            opt.step(scale=0.0) if what == "scale=0" else opt.step()
        except StepError as exc:
            assert words in str(exc), f"the StepError for {what} does not say {words!r}: {exc}"
        else:
            raise AssertionError(f"step() with {what} raised no StepError")
        state[key] = kept
        assert all(torch.equal(a, b) for a, b in zip(before, params(m))), f"a step refused for {what} changed a parameter"
        assert _same_state(opt.state_dict()["state"], saved), f"a step refused for {what} changed the state"


def check_lr_scheduler(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """torch's LR schedulers drive the optimizer (and the contract's get_lr follows)."""
    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    base = opt.get_lr()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. "scheduler.step() before optimizer.step()"
        train(opt, m, 1, inputs)
        sched.step()
    assert math.isclose(opt.get_lr(), base / 2, rel_tol=1e-6), f"get_lr() = {opt.get_lr()}, expected {base / 2}"
    state = sched.state_dict()
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    sched2.load_state_dict(state)


def check_deepcopy(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """A deep copy (model and optimizer together) is independent of the original."""
    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    train(opt, m, 2, inputs)
    model2, opt2 = copy.deepcopy((m, opt))
    before = params(m)
    train(opt2, model2, 2, inputs)
    assert_same(before, params(m), 0.0, "stepping the copy changed the original")
    train(opt, m, 2, inputs)
    assert_same(params(m), params(model2), inputs.atol_for(dtype), "the copy does not continue like the original")


def check_pickle(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """Saved whole after steps (``torch.save((model, optimizer))``: pickling,
    with torch keeping views of one storage together, which plain ``pickle``
    does not), it loads and continues like the original (docs/contract.md:
    copying and pickling keep the class)."""
    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    train(opt, m, 2, inputs)
    buffer = io.BytesIO()
    torch.save((m, opt), buffer)
    buffer.seek(0)
    model2, opt2 = torch.load(buffer, weights_only=False)
    train(opt, m, 2, inputs)
    train(opt2, model2, 2, inputs)
    assert_same(params(m), params(model2), inputs.atol_for(dtype), "the unpickled copy does not continue like the original")


def check_converges(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype = F32) -> None:
    """On a small regression problem the loss falls, at the configured learning
    rate or, where the inputs set none, at one of 1e-3, 1e-2, 1e-1 (defaults
    such as Lion's 1e-4 are meant for long runs, not 150 steps)."""
    failures = []
    for lr in dict.fromkeys([config.get("lr"), 1e-3, 1e-2, 1e-1]):
        try:
            return _converges(config if lr is None else {**config, "lr": lr}, inputs, dtype)
        except AssertionError as exc:
            failures.append(f"lr={lr}: {exc}")
    raise AssertionError("; ".join(failures))


def _converges(config: dict[str, Any], inputs: ConformanceInputs, dtype: torch.dtype) -> None:
    m = model(inputs, dtype=dtype)
    opt = build(config, m)
    batch = data(0, dtype_of(m))
    seen = train(opt, m, inputs.converge_steps, inputs, batch=batch)  # the loss before each step
    first, losses = seen[0], [*seen[1:], float(loss(m, batch).detach())]  # and after each
    assert all(math.isfinite(v) for v in losses), "loss became non-finite"
    assert min(losses) < inputs.converge_ratio * first, (
        f"loss fell only from {first:.4g} to {min(losses):.4g} in {inputs.converge_steps} steps"
    )


Check = Callable[..., None]

CHECKS: dict[str, Check] = {
    "contract": check_contract,
    "grad_ops": check_grad_ops,
    "state_dict_roundtrip": check_state_dict_roundtrip,
    "state_dict_checks": check_state_dict_checks,
    "step_with_scale": check_step_with_scale,
    "closure": check_closure,
    "groups": check_groups,
    "none_grads": check_none_grads,
    "step_errors": check_step_errors,
    "lr_scheduler": check_lr_scheduler,
    "deepcopy": check_deepcopy,
    "pickle": check_pickle,
    "converges": check_converges,
}
