"""The plugin as users meet it: the entry point, name resolution next to
torch's own Adafactor, build_optimizer, and the core's conformance kit."""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points

import pytest
import torch

import optcore
from optcore_adafactor import Adafactor

testing = pytest.importorskip("optcore.testing")

installed = any(
    ep.value == "optcore_adafactor:Adafactor" for ep in entry_points(group="optcore.optimizers")
)
needs_install = pytest.mark.skipif(
    not installed, reason="pip install ./plugins/optcore-adafactor registers the entry point"
)

OURS = "optcore_adafactor:Adafactor"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


@needs_install
def test_entry_point_is_registered() -> None:
    (ep,) = [ep for ep in entry_points(group="optcore.optimizers") if ep.name == "Adafactor" and "optcore_adafactor" in ep.value]
    assert ep.load() is Adafactor


@needs_install
@pytest.mark.parametrize("name", [OURS, "optcore-adafactor:Adafactor", "plugin:Adafactor"])
def test_qualified_names_pick_this_plugin(name: str) -> None:
    spec = optcore.resolve(name)
    assert spec.target is Adafactor and spec.source == "plugin"
    opt = optcore.build_optimizer({"type": name, "beta1": 0.9}, _model())
    assert isinstance(opt, Adafactor) and opt.param_groups[0]["beta1"] == 0.9


@needs_install
def test_plain_name_gives_torch_and_warns_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    from optcore._registry import OPTIMIZERS, ShadowedNameWarning

    monkeypatch.setattr(OPTIMIZERS, "_warned", set())  # the warning is given once per process
    with pytest.warns(ShadowedNameWarning) as caught:
        spec = optcore.resolve("Adafactor")
    assert spec.source == "torch" and spec.target is torch.optim.Adafactor
    message = str(caught[0].message)
    assert "torch:Adafactor" in message and "optcore-adafactor:Adafactor" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShadowedNameWarning)
        assert optcore.resolve("torch:Adafactor").target is torch.optim.Adafactor


@needs_install
def test_build_reports_config_errors_with_the_field() -> None:
    with pytest.raises(optcore.ConfigError) as info:
        optcore.build_optimizer({"type": OURS, "lr": 1e-3}, _model())
    assert info.value.problems[0][0] == "lr" and "relative_step=False" in str(info.value)


@needs_install
@pytest.mark.parametrize("check", list(testing.CHECKS))
def test_conformance_manual_lr(check: str) -> None:
    """Every shared check, with the class's conformance_inputs (manual lr)."""
    testing.run_check(check, {"type": OURS})


#: set_lr and torch's LR schedulers have nothing to drive in relative-step mode.
RELATIVE_STEP_CHECKS = [c for c in testing.CHECKS if c not in ("contract", "lr_scheduler")]


@needs_install
@pytest.mark.parametrize("check", RELATIVE_STEP_CHECKS)
@pytest.mark.parametrize("config", [{}, {"beta1": 0.9, "warmup_init": False}])
def test_conformance_relative_step(check: str, config: dict) -> None:
    testing.run_check(check, {"type": OURS, **config}, inputs=testing.ConformanceInputs())


@needs_install
@pytest.mark.parametrize("implementation", ["auto", "torch", "compiled"])
@pytest.mark.parametrize(("check", "dtype"), testing.conformance_cases(OURS))
def test_conformance_per_dtype_and_implementation(
    check: str, dtype: str, implementation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit in every dtype Adafactor declares, on each implementation
    ('compiled' traced by dynamo and run by the eager backend here, to keep the
    kit quick; test_adafactor_compile runs inductor)."""
    from optcore_adafactor import functional

    monkeypatch.setattr(functional.CompiledUpdate, "backend", "eager")
    if implementation == "compiled":
        # Each check builds new shapes; across the whole matrix in one process they would pass
        # dynamo's recompile limit (8) for the one update function (see the plugin README).
        torch._dynamo.reset()
    testing.run_check(check, {"type": OURS, "implementation": implementation}, dtype=dtype)
