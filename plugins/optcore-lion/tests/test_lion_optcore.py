"""Lion through optcore: the shared conformance kit, build_optimizer, and the
entry point (its tests run once the distribution is pip-installed)."""

from __future__ import annotations

from importlib.metadata import entry_points

import optcore
import pytest
import torch
from optcore.testing import CHECKS, run_check
from optcore_lion import Lion

INSTALLED = any(ep.value == "optcore_lion:Lion" for ep in entry_points(group="optcore.optimizers", name="Lion"))
needs_install = pytest.mark.skipif(not INSTALLED, reason="pip install ./plugins/optcore-lion to test the entry point")


IMPLS = {"default": {}, "foreach": {"foreach": True}, "forloop": {"fused": False, "foreach": False}}


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS)
@pytest.mark.parametrize("check", CHECKS)
def test_lion_passes_the_conformance_kit(check, impl):
    run_check(check, {"type": "optcore_lion:Lion", "lr": 1e-3, **impl})


def test_lion_builds_from_a_config_with_decay_groups():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    opt = optcore.build_optimizer(
        {"type": "optcore_lion:Lion", "lr": 3e-4, "betas": "(0.9, 0.98)", "weight_decay": 0.1}, model
    )
    assert isinstance(opt, Lion) and opt.defaults["betas"] == (0.9, 0.98)
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.1]  # biases and norms: no decay
    assert opt.optimizer_config["lr"] == 3e-4


def test_lion_config_errors_name_the_field():
    with pytest.raises(optcore.ConfigError) as info:
        config = {"type": "optcore_lion:Lion", "lr": -1, "beta": 0.9}
        optcore.build_optimizer(config, [torch.zeros(2, requires_grad=True)])
    fields = {name for name, _ in info.value.problems}
    assert {"lr", "beta"} <= fields and "betas" in str(info.value)  # the misspelt field gets a suggestion


@needs_install
@pytest.mark.parametrize("name", ["optcore-lion:Lion", "optcore_lion:Lion", "plugin:Lion"])
def test_lion_entry_point_resolves_by_qualified_name(name):
    spec = optcore.resolve(name)
    assert spec.target is Lion and spec.source == "plugin"
    assert isinstance(optcore.build_optimizer({"type": name}, [torch.zeros(2, requires_grad=True)]), Lion)


@needs_install
def test_lion_plain_name_is_ours_unless_an_installed_package_has_it_first():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the shadowing warning is the core's, tested there
        spec = optcore.resolve("Lion")
        opt = optcore.build_optimizer({"type": "Lion"}, [torch.zeros(2, requires_grad=True)])
    if spec.source == "plugin":
        assert isinstance(opt, Lion)
    else:  # e.g. lion-pytorch is installed: ours is listed as shadowed, one qualified name away
        assert "optcore-lion:Lion" in [s.qualified for s in spec.shadowed]
