"""Resolution order, shadowing, qualified names, register_optimizer, entry points."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import optcore
from optcore._registry import ShadowedNameWarning

PLUGIN_SOURCE = """
import torch
import optcore
from optcore._fields import HParams, LR

class SignConfig(HParams):
    lr: LR = 0.01

class SignSGD(optcore.Optimizer):
    '''Sign descent: p -= lr * sign(g).'''
    config_schema = SignConfig
    supports_flat_params = True

    def __init__(self, params, lr=0.01):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None, scale=1.0, groups=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self._select_groups(groups):
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])
        return loss

class Adafactor(SignSGD):
    '''A plugin name that torch also has.'''
"""


@pytest.mark.parametrize("spelling", ["AdamW", "adamw", "adam_w", "ADAM-W", " AdamW "])
def test_names_ignore_case_and_separators(spelling):
    assert optcore.resolve(spelling).target is torch.optim.AdamW


def test_torch_first_and_qualified_names():
    spec = optcore.resolve("SGD")
    assert spec.source == "torch" and spec.provider == "torch" and spec.qualified == "torch:SGD"
    assert optcore.resolve("torch:SGD").target is torch.optim.SGD


def test_unknown_name_says_where_it_looked_and_suggests():
    with pytest.raises(optcore.OptimizerNotFoundError) as info:
        optcore.resolve("AdamWW")
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, optcore.OptcoreError)
    assert "AdamW" in err.suggestions
    assert "Looked in" in str(err) and "optcore list" in str(err)


def test_dotted_paths_pick_a_class_directly():
    assert optcore.resolve("torch.optim.SGD").target is torch.optim.SGD
    assert optcore.resolve("torch.optim:SGD").target is torch.optim.SGD
    with pytest.raises(optcore.OptimizerNotFoundError):
        optcore.resolve("not_a_module_xyz.Opt")
    with pytest.raises(optcore.OptimizerNotFoundError):  # a module's missing name is not a plugin failure
        optcore.resolve("torch.optim:NoSuchClass")


def test_register_optimizer_three_spellings():
    class MyOpt(torch.optim.SGD):
        """My optimizer."""

    try:
        optcore.register_optimizer("MyOptA", MyOpt)
        optcore.register_optimizer(MyOpt)

        @optcore.register_optimizer("MyOptC", schema=None)
        class MyOptC(torch.optim.SGD):
            pass

        for name in ("MyOptA", "my_opt", "myoptc", "user:MyOptA"):
            spec = optcore.resolve(name)
            assert spec.source == "user"
        assert optcore.resolve("MyOpt").description == "My optimizer."
        with pytest.raises(optcore.ConfigError, match="already registered"):
            optcore.register_optimizer("MyOptA", MyOptC)
        optcore.register_optimizer("MyOptA", MyOptC, override=True)
        assert optcore.resolve("MyOptA").target is MyOptC
    finally:
        for n in ("MyOptA", "MyOpt", "MyOptC"):
            optcore.unregister_optimizer(n)
    with pytest.raises(optcore.OptimizerNotFoundError):
        optcore.resolve("MyOptA")


def test_register_with_schema_validates(model):
    from pydantic import Field

    from optcore._fields import HParams

    class Cfg(HParams):
        lr: float = Field(0.1, gt=0)

    optcore.register_optimizer("SchemaSGD", torch.optim.SGD, schema=Cfg)
    try:
        with pytest.raises(optcore.ConfigError, match="lr"):
            optcore.build_optimizer({"type": "SchemaSGD", "lr": 0}, model)
        with pytest.raises(optcore.ConfigError, match="momentum"):
            optcore.build_optimizer({"type": "SchemaSGD", "momentum": 0.9}, model)
        assert optcore.build_optimizer({"type": "SchemaSGD", "lr": 0.5}, model).get_lr() == 0.5
    finally:
        optcore.unregister_optimizer("SchemaSGD")


def test_registering_a_taken_name_warns_how_to_pick_it():
    with pytest.warns(ShadowedNameWarning, match="user:SGD"):
        optcore.register_optimizer("SGD", torch.optim.Adam)
    try:
        assert optcore.resolve("SGD").target is torch.optim.SGD
        assert optcore.resolve("user:SGD").target is torch.optim.Adam
    finally:
        optcore.unregister_optimizer("SGD")


def test_entry_point_plugin_is_lazy_and_resolves(fake_plugins, model):
    fake_plugins("optcore-sign", "optcore_sign_fake", PLUGIN_SOURCE,
                 {"optcore.optimizers": {"SignDescent": "optcore_sign_fake:SignSGD", "Adafactor": "optcore_sign_fake:Adafactor"}})
    names = {s.name for s in optcore.list_optimizers()}
    assert "SignDescent" in names
    assert "optcore_sign_fake" not in sys.modules, "listing must not import the plugin"
    spec = optcore.resolve("signdescent")
    assert (spec.source, spec.provider, spec.version) == ("plugin", "optcore-sign", "1.0")
    opt = optcore.build_optimizer({"type": "SignDescent", "lr": 0.5}, model)
    assert "optcore_sign_fake" in sys.modules
    assert opt.supports_flat_params and opt.get_lr() == 0.5
    assert optcore.resolve("optcore-sign:SignDescent").target is spec.target
    assert optcore.resolve("optcore_sign:SignDescent").target is spec.target


def test_plugin_shadowed_by_torch_warns_and_can_be_picked(fake_plugins):
    fake_plugins("optcore-sign", "optcore_sign_fake2", PLUGIN_SOURCE,
                 {"optcore.optimizers": {"Adafactor": "optcore_sign_fake2:Adafactor"}})
    optcore.resolve("SGD")  # unrelated names do not warn
    with pytest.warns(ShadowedNameWarning, match="optcore-sign:Adafactor"):
        spec = optcore.resolve("Adafactor")
    assert spec.source == "torch"
    assert "optcore-sign:Adafactor" in [s.qualified for s in spec.shadowed]
    assert optcore.resolve("optcore-sign:Adafactor").source == "plugin"
    assert optcore.resolve("plugin:Adafactor").source == "plugin"
    listed = {s.qualified for s in optcore.list_optimizers(all=True)}
    assert {"torch:Adafactor", "optcore-sign:Adafactor"} <= listed


def test_broken_plugin_fails_only_for_its_name(fake_plugins, model):
    fake_plugins("optcore-broken", "optcore_broken_fake", "raise RuntimeError('boom at import')",
                 {"optcore.optimizers": {"Broken": "optcore_broken_fake:Broken"}})
    fake_plugins("optcore-sign", "optcore_sign_fake3", PLUGIN_SOURCE,
                 {"optcore.optimizers": {"SignDescent": "optcore_sign_fake3:SignSGD"}})
    with pytest.raises(optcore.PluginLoadError) as info:
        optcore.build_optimizer("Broken", model)
    msg = str(info.value)
    assert "optcore-broken 1.0" in msg and "optcore.optimizers:Broken" in msg and "boom at import" in msg
    assert info.value.distribution == "optcore-broken"
    optcore.build_optimizer("SignDescent", model)
    optcore.build_optimizer("AdamW", model)


def test_plugin_with_a_bad_schema_is_rejected(fake_plugins):
    fake_plugins("optcore-badschema", "optcore_badschema_fake",
                 "import torch\nclass Bad(torch.optim.SGD):\n    config_schema = dict\n",
                 {"optcore.optimizers": {"BadSchema": "optcore_badschema_fake:Bad"}})
    with pytest.raises(optcore.PluginLoadError, match="pydantic"):
        optcore.resolve("BadSchema").target


def test_environment_switches(fake_plugins, monkeypatch):
    import optcore._plugins as plugins

    fake_plugins("optcore-sign", "optcore_sign_fake4", PLUGIN_SOURCE,
                 {"optcore.optimizers": {"SignDescent": "optcore_sign_fake4:SignSGD"}})
    fake_plugins("optcore-other", "optcore_other_fake", PLUGIN_SOURCE,
                 {"optcore.optimizers": {"OtherSGD": "optcore_other_fake:SignSGD"}})
    monkeypatch.setenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(optcore.OptimizerNotFoundError):
        optcore.resolve("SignDescent")
    monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("OPTCORE_PLUGINS", "optcore-other")
    with pytest.raises(optcore.OptimizerNotFoundError):
        optcore.resolve("SignDescent")
    assert optcore.resolve("OtherSGD").source == "plugin"
    monkeypatch.delenv("OPTCORE_PLUGINS")
    assert optcore.resolve("SignDescent").source == "plugin"
    plugins.refresh()


def test_import_is_lazy():
    code = (
        "import sys, torch; before = set(sys.modules); import optcore; new = set(sys.modules) - before; "
        "bad = [m for m in new if m.split('.')[0] in {'pydantic', 'pluggy', 'lion_pytorch', 'transformers', "
        "'pytorch_optimizer', 'optcore_lion', 'optcore_adafactor', 'optcore_fp16', 'rich', 'yaml'}]; "
        "print(bad); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import optcore, sys; optcore.list_optimizers(); assert 'lion_pytorch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shadow_warning_names_both_once(fake_plugins):
    fake_plugins("optcore-sign", "optcore_sign_fake5", PLUGIN_SOURCE,
                 {"optcore.optimizers": {"Adafactor": "optcore_sign_fake5:Adafactor"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optcore.resolve("Adafactor")
        optcore.resolve("Adafactor")
    shadow = [w for w in caught if issubclass(w.category, ShadowedNameWarning)]
    assert len(shadow) == 1 and "torch:Adafactor" in str(shadow[0].message)


@pytest.mark.parametrize("road", ["resolve", "plan", "build_optimizer", "check_config"])
def test_the_shadowing_warning_points_at_the_users_line(road):
    """Whichever road a name takes, the warning names the caller's file, not
    optcore's (a fixed stacklevel is right for one road only)."""
    import optcore._registry as registry
    from optcore.cli import check_config

    calls = {
        "resolve": lambda: optcore.resolve("Lion"),
        "plan": lambda: optcore.plan({"type": "Lion"}),
        "build_optimizer": lambda: optcore.build_optimizer({"type": "Lion"}, torch.nn.Linear(2, 2)),
        "check_config": lambda: check_config({"type": "Lion"}),
    }
    if not optcore.resolve("Lion").shadowed:
        pytest.skip("only one provider of 'Lion' is installed here")
    registry.OPTIMIZERS._warned.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        calls[road]()
    shadowing = [w for w in seen if issubclass(w.category, registry.ShadowedNameWarning)]
    assert shadowing and {w.filename for w in shadowing} == {__file__}, [(w.filename, w.lineno) for w in shadowing]
