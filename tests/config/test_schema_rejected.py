"""Whatever a constructor raises about its arguments reaches the user as one
ConfigError naming the class, with the original exception as the cause."""

from __future__ import annotations

import warnings

import pytest
import torch

import optcore
from optcore import ConfigError
from optcore._errors import rejected_config


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))


def _build(config, model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Lion" is shadowed: lion-pytorch wins over the plugin
        return optcore.build_optimizer(config, model)


def test_lion_pytorch_assert_is_a_config_error(model):
    pytest.importorskip("lion_pytorch")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError) as info:
        _build({"type": "Lion", "lr": 0.0}, model)
    assert isinstance(info.value.__cause__, AssertionError)
    assert "lion_pytorch:Lion" in str(info.value) and "assert lr > 0" in str(info.value)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_pytorch_optimizer_own_exception_is_a_config_error(model):
    pytest.importorskip("pytorch_optimizer")
    with pytest.raises(ConfigError, match="pytorch_optimizer:Prodigy") as info:
        _build({"type": "pytorch_optimizer:Prodigy", "lr": -1}, model)
    assert type(info.value.__cause__).__name__ == "NegativeLRError"


class _Spec:
    name = "Thing"
    qualified = "tests:Thing"


@pytest.mark.parametrize("exc", [AssertionError(), LookupError("no"), ZeroDivisionError("x"), OverflowError("big"),
                                 RuntimeError("r"), AttributeError("a"), type("LibError", (Exception,), {})("lib"),
                                 SystemExit(1)])
def test_every_exception_becomes_a_config_error_with_its_cause(exc):
    with pytest.raises(ConfigError) as info:
        with rejected_config(_Spec(), config={"type": "Thing", "lr": 0.5}):
            raise exc
    assert info.value.__cause__ is exc
    assert "tests:Thing" in str(info.value) and "'lr': 0.5" in str(info.value)
    assert type(exc).__name__ in str(info.value)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), MemoryError()])
def test_interrupts_and_memory_errors_propagate(exc):
    """A constructor's SystemExit is a ConfigError (a library must not end the user's
    process from a config: optcore.guards); an interrupt and running out of memory are not."""
    with pytest.raises(type(exc)):
        with rejected_config(_Spec()):
            raise exc


def test_optcore_errors_pass_through_unchanged():
    original = ConfigError("mine")
    with pytest.raises(ConfigError) as info:
        with rejected_config(_Spec()):
            raise original
    assert info.value is original


def test_registered_optimizer_raising_anything_is_a_config_error(model):
    class Picky(torch.optim.SGD):
        def __init__(self, params, lr=0.1, mode="a"):
            if mode != "a":
                raise LookupError(f"unknown mode {mode}")
            super().__init__(params, lr=lr)

    optcore.register_optimizer("PickyForTest", Picky)
    try:
        with pytest.raises(ConfigError, match="PickyForTest") as info:
            optcore.build_optimizer({"type": "PickyForTest", "mode": "b"}, model)
        assert isinstance(info.value.__cause__, LookupError)
    finally:
        optcore.unregister_optimizer("PickyForTest")


def test_a_huge_constructor_message_is_cut():
    with pytest.raises(ConfigError) as info:
        with rejected_config(_Spec(), config={"lr": "y" * 1_000_000}):
            raise ValueError("bad value " + "z" * 1_000_000)
    assert len(str(info.value)) < 2000
