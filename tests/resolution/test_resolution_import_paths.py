"""Import paths in a config: what they may name, the switch that turns them
off, and the limits on what a name costs and shows."""

from __future__ import annotations

import sys

import pytest
import torch

import optcore
import optcore._resolution as registry
from optcore import ConfigError, OptimizerNotFoundError, PluginLoadError

FACTORY_MODULE = """
import torch
CALLS = []

def factory(params, lr=0.1):
    CALLS.append(lr)
    return torch.optim.SGD(params, lr=lr)

class NotAnOptimizer:
    def __init__(self, params, **kw):
        CALLS.append("constructed")
"""


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    """A module ``optcore_fake_factories`` on sys.path that records every call."""
    (tmp_path / "optcore_fake_factories.py").write_text(FACTORY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "optcore_fake_factories"
    sys.modules.pop("optcore_fake_factories", None)


# ------------------------------------------------------------------ A: what it names
def test_a_dotted_path_to_a_value_is_a_config_error_saying_what_it_found(model):
    with pytest.raises(ConfigError) as info:
        optcore.resolve("math.pi")
    msg = str(info.value)
    assert "math.pi" in msg and "float" in msg and "3.14159" in msg and "torch.optim.Optimizer subclass" in msg
    with pytest.raises(ConfigError, match="float"):  # not "TypeError: 3.14... is not a callable object"
        optcore.build_optimizer({"type": "math.pi"}, model)


def test_a_dotted_path_to_a_module_or_a_scheduler_class_is_refused():
    with pytest.raises(ConfigError, match="the module torch.optim"):
        optcore.resolve("torch.optim")
    with pytest.raises(ConfigError, match="the class torch.optim.lr_scheduler.StepLR"):
        optcore.resolve("torch.optim.lr_scheduler.StepLR")


# -------------------------------------------------------- B: a missing attribute
def test_b_a_missing_attribute_is_not_found_with_close_names_from_that_module():
    with pytest.raises(OptimizerNotFoundError) as info:
        optcore.resolve("torch.optim.NoSuchOptimizer")
    assert not isinstance(info.value, PluginLoadError)
    assert "Reinstall" not in str(info.value) and "torch.optim" in str(info.value)
    with pytest.raises(OptimizerNotFoundError) as info:
        optcore.resolve("torch.optim.AdamWW")
    assert "torch.optim.AdamW" in info.value.suggestions
    with pytest.raises(OptimizerNotFoundError) as info:
        optcore.resolve("torch.optim:Adamw_")
    assert "torch.optim:AdamW" in info.value.suggestions
    with pytest.raises(OptimizerNotFoundError, match="no module 'torch.optim.nosuch'"):
        optcore.resolve("torch.optim.nosuch.Opt")


# ---------------------------------------------- C: nothing but classes is called
def test_c_a_config_cannot_call_an_arbitrary_function(tmp_path, model):
    target = tmp_path / "x.pt"
    with pytest.raises(ConfigError, match="the function torch.serialization.save"):
        optcore.build_optimizer({"type": "torch.serialization:save", "f": str(target)}, model)
    assert not target.exists()
    with pytest.raises(ConfigError):
        optcore.build_optimizer({"type": "torch.serialization.save", "f": str(target)}, model)
    assert not target.exists()


def test_c_unregistered_factories_and_classes_are_refused_before_any_call(factory_module, model):
    mod = __import__(factory_module)
    for name in (f"{factory_module}:factory", f"{factory_module}.factory", f"{factory_module}:NotAnOptimizer"):
        with pytest.raises(ConfigError, match="register_optimizer"):
            optcore.resolve(name)
        with pytest.raises(ConfigError):
            optcore.build_optimizer({"type": name, "lr": 0.5}, model)
    assert mod.CALLS == []


def test_c_a_registered_factory_may_be_named_by_its_path(factory_module, model):
    mod = __import__(factory_module)
    optcore.register_optimizer("FakeFactory", mod.factory)
    try:
        spec = optcore.resolve(f"{factory_module}:factory")
        assert (spec.source, spec.name) == ("user", "FakeFactory")
        opt = optcore.build_optimizer({"type": f"{factory_module}.factory", "lr": 0.5}, model)
        assert mod.CALLS == [0.5] and opt.get_lr() == 0.5
    finally:
        optcore.unregister_optimizer("FakeFactory")


def test_c_an_entry_point_factory_may_be_named_by_its_path(fake_plugins, model):
    fake_plugins("optcore-fakefactory", "optcore_fakefactory_ep", FACTORY_MODULE,
                 {"optcore.optimizers": {"EpFactory": "optcore_fakefactory_ep:factory"}})
    spec = optcore.resolve("optcore_fakefactory_ep:factory")
    assert (spec.source, spec.provider, spec.name) == ("plugin", "optcore-fakefactory", "EpFactory")
    assert optcore.build_optimizer({"type": "optcore_fakefactory_ep.factory", "lr": 0.25}, model).get_lr() == 0.25


def test_c_scheduler_import_paths_name_scheduler_classes_only():
    from optcore.schedulers import resolve_scheduler

    assert resolve_scheduler("torch.optim.lr_scheduler.StepLR").target is torch.optim.lr_scheduler.StepLR
    assert resolve_scheduler("torch.optim.lr_scheduler:ReduceLROnPlateau").target is torch.optim.lr_scheduler.ReduceLROnPlateau
    for name in ("torch.serialization.save", "torch.optim.SGD", "math.pi"):
        with pytest.raises(ConfigError, match="LRScheduler subclass"):
            resolve_scheduler(name)


def test_c_turning_import_paths_off_imports_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "optcore_fake_import_marker.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nimport torch\nclass Opt(torch.optim.SGD): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spelling in ("optcore_fake_import_marker.Opt", "optcore_fake_import_marker:Opt", "this:x", "this.x"):
        with pytest.raises(ConfigError) as info:
            optcore.resolve(spelling, allow_import_paths=False)
        assert "register_optimizer" in str(info.value) and "import paths are turned off" in str(info.value)
    for value in ("0", "false", "No", " off "):
        monkeypatch.setenv("OPTCORE_ALLOW_IMPORT_PATHS", value)
        with pytest.raises(ConfigError, match="import paths are turned off"):
            optcore.resolve("optcore_fake_import_marker.Opt")
    assert not marker.exists() and "optcore_fake_import_marker" not in sys.modules and "this" not in sys.modules
    # Names optcore knows still resolve, qualified ones included.
    assert optcore.resolve("AdamW").target is torch.optim.AdamW
    assert optcore.resolve("torch:SGD").target is torch.optim.SGD
    with pytest.raises(ConfigError, match="use type='torch:SGD'"):
        optcore.resolve("torch.optim.SGD")
    # The keyword wins over the environment.
    try:
        assert optcore.resolve("optcore_fake_import_marker.Opt", allow_import_paths=True).target.__name__ == "Opt"
        assert marker.exists()
    finally:
        sys.modules.pop("optcore_fake_import_marker", None)
    monkeypatch.setenv("OPTCORE_ALLOW_IMPORT_PATHS", "1")
    assert optcore.resolve("torch.optim.SGD").target is torch.optim.SGD


def test_c_the_scheduler_resolver_takes_the_switch_too():
    from optcore.schedulers import resolve_scheduler

    with pytest.raises(ConfigError, match="import paths are turned off"):
        resolve_scheduler("torch.optim.lr_scheduler.StepLR", allow_import_paths=False)
    assert resolve_scheduler("StepLR", allow_import_paths=False).target is torch.optim.lr_scheduler.StepLR


# ------------------------------------------------------------ G: resource limits
def test_g_a_huge_name_is_refused_before_any_work(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("compared a huge name with the known ones")

    monkeypatch.setattr(registry, "close_matches", no_work)
    monkeypatch.setattr(registry, "normalize", no_work)
    for name in ("a" * 10_000_000, "torch.optim." + "x" * 1000, "torch:" + "y" * 500):
        with pytest.raises(ConfigError) as info:
            optcore.resolve(name)
        assert len(str(info.value)) < 400 and f"{len(name):,} characters" in str(info.value)


def test_g_messages_cut_long_names_and_escape_control_characters():
    with pytest.raises(OptimizerNotFoundError) as info:
        optcore.resolve("Adam\x1b[2J\x1b]0;owned\x07" + "q" * 180)
    msg = str(info.value)
    assert "\x1b" not in msg and "\x07" not in msg and "\\x1b[2J" in msg
    assert "q" * 150 not in msg and "chars)" in msg
    with pytest.raises(OptimizerNotFoundError) as info:
        optcore.resolve("torch.optim.Nope\x1b[31m")
    assert "\x1b" not in str(info.value)


def test_g_plugin_load_errors_cut_and_escape_what_the_plugin_says(fake_plugins):
    fake_plugins("optcore-noisy", "optcore_noisy_fake", "raise RuntimeError('\\x1b[31m' + 'boom ' * 20000)",
                 {"optcore.optimizers": {"Noisy\x1b[0m": "optcore_noisy_fake:Opt"}})
    spec = next(s for s in optcore.list_optimizers() if s.provider == "optcore-noisy")
    with pytest.raises(PluginLoadError) as info:
        spec.target
    msg = str(info.value)
    assert "\x1b" not in msg and len(msg) < 1500 and "optcore-noisy" in msg and "chars)" in msg


def test_g_the_message_helpers_escape_and_cut():
    from optcore._values import clean_text, short_repr

    assert clean_text("ok\x1b[1mbold\r", 100) == "ok\\x1b[1mbold\\r"
    assert clean_text("x" * 50, 10) == "x" * 10 + "…(50 chars)"
    assert clean_text(ValueError("a\nb")) == "a\\nb"
    assert short_repr("a\x00b") == "'a\\x00b'"
    assert short_repr("z" * 300, 5) == "'zzzzz'…(300 chars)"


def test_module_import_failures_are_config_errors_naming_the_module(tmp_path, monkeypatch):
    (tmp_path / "optcore_fake_exits.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "optcore_fake_needs.py").write_text("import optcore_no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"importing module optcore_fake_exits failed \(SystemExit: 3\)"):
        optcore.resolve("optcore_fake_exits.Opt")
    with pytest.raises(ConfigError, match="optcore_no_such_dependency_xyz"):
        optcore.resolve("optcore_fake_needs:Opt")
    for m in ("optcore_fake_exits", "optcore_fake_needs"):
        sys.modules.pop(m, None)


def test_a_plain_name_still_resolves_after_the_checks():
    assert optcore.resolve("torch.optim.SGD").target is torch.optim.SGD
    assert optcore.resolve("torch.optim:SGD").target is torch.optim.SGD


@pytest.mark.parametrize("path", ["torch.optim.AdamW", "torch.optim:AdamW", "torch.optim.adamw.AdamW"])
def test_a_path_to_torchs_own_class_is_the_torch_name(path, model):
    """Same class, same record: its schema and optcore's default (fused where
    the device allows), not a slower build for spelling it as a path."""
    by_name = optcore.build_optimizer({"type": "AdamW", "lr": 1e-3}, model)
    by_path = optcore.build_optimizer({"type": path, "lr": 1e-3}, model)
    assert optcore.plan({"type": path, "lr": 1e-3}).spec.qualified == "torch:AdamW"
    assert by_path.param_groups[0]["fused"] == by_name.param_groups[0]["fused"] is True


def test_a_path_to_a_subclass_of_a_torch_class_stays_its_own(tmp_path, monkeypatch, model):
    (tmp_path / "my_adamw_mod.py").write_text("import torch\nclass AdamW(torch.optim.AdamW):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = optcore.plan({"type": "my_adamw_mod:AdamW", "lr": 1e-3}).spec
    assert spec.source == "package" and spec.qualified == "my_adamw_mod:AdamW"
