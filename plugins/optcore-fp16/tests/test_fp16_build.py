"""Both ways in through the core: the shorthand (the pluggy hook) and the
wrappers as named types; plus the shared conformance kit."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings
from collections.abc import Iterator

import pytest
import torch
from fp16_helpers import HalfSGD, adamw, data, loss_fn, mlp
from optcore_fp16 import FP16Optimizer, MemoryEfficientFP16Optimizer
from optcore_fp16.hooks import optcore_rewrite_config

import optcore
from optcore import ConfigError

INSTALLED = any(ep.name == "FP16Optimizer" for ep in importlib.metadata.entry_points(group="optcore.optimizers"))
needs_install = pytest.mark.skipif(not INSTALLED, reason="optcore-fp16 is not pip-installed (no entry points)")


@pytest.fixture
def half_sgd() -> Iterator[str]:
    """HalfSGD registered by name, for memory-efficient builds without other plugins."""
    optcore.register_optimizer("Fp16TestHalfSGD", HalfSGD)
    yield "Fp16TestHalfSGD"
    optcore.unregister_optimizer("Fp16TestHalfSGD")


# --------------------------------------------------------------------- hook
def test_rewrite_turns_the_shorthand_into_the_wrapper_form() -> None:
    assert optcore_rewrite_config({"type": "AdamW", "lr": 1e-3}) is None
    assert optcore_rewrite_config({"type": "AdamW", "precision": "fp32", "memory_efficient": None}) == {"type": "AdamW"}
    assert optcore_rewrite_config({"type": "AdamW", "lr": 1e-3, "precision": "fp16", "loss_scaler": {"init_scale": 32}}) == {
        "type": "optcore-fp16:FP16Optimizer",
        "optimizer": {"type": "AdamW", "lr": 1e-3},
        "precision": "fp16",
        "loss_scaler": {"init_scale": 32},
    }
    rewritten = optcore_rewrite_config({"type": "SGD", "precision": "bf16", "memory_efficient": True})
    assert rewritten == {
        "type": "optcore-fp16:MemoryEfficientFP16Optimizer",
        "optimizer": {"type": "SGD"},
        "precision": "bf16",
    }


def test_rewrite_rejects_stray_and_bad_options() -> None:
    with pytest.raises(ConfigError, match="only apply to half-precision"):
        optcore_rewrite_config({"type": "AdamW", "memory_efficient": True})
    with pytest.raises(ConfigError) as err:
        optcore_rewrite_config({"type": "AdamW", "precision": "fp8", "loss_scaler": {"scale_window": 0}})
    assert {f for f, _ in err.value.problems} == {"precision", "loss_scaler.scale_window"}


@needs_install
def test_the_wrapper_form_is_left_alone_and_plans_alike() -> None:
    wrapper_form = {"type": "FP16Optimizer", "optimizer": {"type": "AdamW"}, "precision": "bf16"}
    assert optcore_rewrite_config(dict(wrapper_form)) is None
    shorthand = optcore.plan({"type": "AdamW", "precision": "bf16"})
    named = optcore.plan(wrapper_form)
    assert [s.qualified for s in shorthand.chain] == [s.qualified for s in named.chain]
    assert shorthand.param_dtype is named.param_dtype is torch.bfloat16


# -------------------------------------------------------------------- build
@needs_install
def test_shorthand_and_named_forms_train_identically() -> None:
    x, y = data()
    runs = []
    for config in (
        {"type": "AdamW", "lr": 1e-2, "precision": "fp16", "loss_scaler": {"init_scale": 256}},
        {"type": "FP16Optimizer", "optimizer": {"type": "AdamW", "lr": 1e-2}, "loss_scaler": {"init_scale": 256}},
    ):
        model = mlp(torch.float16)
        opt = optcore.build_optimizer(config, model)
        assert isinstance(opt, FP16Optimizer) and opt.flat and opt.loss_scale == 256
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = loss_fn(model, x, y)
            opt.backward(loss)
            opt.step()
            losses.append(float(loss.detach()))
        runs.append(losses)
    assert runs[0] == runs[1]


@needs_install
def test_bf16_and_memory_efficient_builds(half_sgd: str) -> None:
    opt = optcore.build_optimizer({"type": "AdamW", "precision": "bf16"}, mlp(torch.bfloat16))
    assert isinstance(opt, FP16Optimizer) and opt.loss_scale is None
    model = mlp(torch.float16)
    opt = optcore.build_optimizer({"type": half_sgd, "precision": "fp16", "memory_efficient": True}, model)
    assert isinstance(opt, MemoryEfficientFP16Optimizer) and isinstance(opt.optimizer, HalfSGD)
    opt = optcore.build_optimizer(
        {"type": "MemoryEfficientFP16Optimizer", "optimizer": {"type": half_sgd}, "precision": "fp16"}, model
    )
    assert isinstance(opt, MemoryEfficientFP16Optimizer)
    with pytest.raises(ConfigError, match="FP16Optimizer"):
        optcore.build_optimizer({"type": "AdamW", "precision": "fp16", "memory_efficient": True}, model)


@needs_install
def test_named_form_validates_every_field() -> None:
    with pytest.raises(ConfigError) as err:
        optcore.build_optimizer(
            {"type": "FP16Optimizer", "optimizer": {"type": "AdamW"}, "flat": "maybe", "loss_scaler": {"tolerance": 2}},
            mlp(torch.float16),
        )
    assert {f for f, _ in err.value.problems} == {"flat", "loss_scaler.tolerance"}


@needs_install
def test_entry_points_and_resolution() -> None:
    spec = optcore.resolve("FP16Optimizer")
    assert spec.target is FP16Optimizer and spec.source == "plugin" and spec.provider == "optcore-fp16"
    assert optcore.resolve("MemoryEfficientFP16Optimizer").target is MemoryEfficientFP16Optimizer
    hooks = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="optcore.hooks")}
    assert hooks.get("fp16") == "optcore_fp16.hooks"


# --------------------------------------------------------- conformance kit
_CONFIGS = {
    "shorthand-fp16": {"type": "AdamW", "lr": 1e-2, "precision": "fp16"},
    "named-per-tensor": {"type": "FP16Optimizer", "optimizer": {"type": "AdamW", "lr": 1e-2}, "flat": False},
    "shorthand-bf16": {"type": "AdamW", "lr": 1e-2, "precision": "bf16"},
}
if importlib.util.find_spec("optcore_lion"):
    _CONFIGS["lion-memory-efficient"] = {
        "type": "optcore-lion:Lion",
        "lr": 1e-3,
        "precision": "fp16",
        "memory_efficient": True,
    }

# What the kit cannot check on a precision wrapper (strict xfail: a change that
# makes it pass must update this table):
_KNOWN: dict[str, str] = {}


@needs_install
@pytest.mark.parametrize(
    "check",
    [
        "contract",
        "grad_ops",
        "state_dict_roundtrip",
        "step_with_scale",
        "closure",
        "groups",
        "none_grads",
        "lr_scheduler",
        "deepcopy",
        "converges",
    ],
)
@pytest.mark.parametrize("name", list(_CONFIGS))
def test_conformance(name: str, check: str, request: pytest.FixtureRequest) -> None:
    from optcore.testing import run_check

    config = _CONFIGS[name]
    reason = _KNOWN.get(check)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    with warnings.catch_warnings():
        # the kit's models are fp32: the wrapper says it gains nothing there
        warnings.filterwarnings("ignore", message=".*no trainable parameter is")
        warnings.filterwarnings("ignore", message=".*not produced by optimizer.backward")
        run_check(check, config)


@needs_install
def test_memory_efficient_with_an_unfit_optimizer_is_refused_at_plan_time_naming_the_fit_ones() -> None:
    """`optcore check` (a plan, no parameters) already refuses it, and the message lists
    the installed optimizers whose capability flag fits, read from the registry."""
    with pytest.raises(ConfigError) as err:
        optcore.plan({"type": "SGD", "precision": "bf16", "memory_efficient": True})
    fitting = [
        s.qualified
        for s in optcore.list_optimizers(all=True)
        if s.source == "plugin" and not s.is_wrapper and s.capabilities.memory_efficient_fp16
    ]
    assert fitting, "no installed plugin declares supports_memory_efficient_fp16"
    assert all(repr(q) in str(err.value) for q in fitting)
