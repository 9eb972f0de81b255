"""build_optimizer: config forms, schemas, param groups, implementation choice, errors."""

from __future__ import annotations

import sys

import pytest
import torch

import optcore


def implementation_of(optimizer: torch.optim.Optimizer) -> str:
    """The path a torch optimizer's groups ask for: fused, foreach, or torch's default."""
    groups = optimizer.param_groups
    for path in ("fused", "foreach"):
        if all(g.get(path) for g in groups):
            return path
    return "default"


def test_config_forms_agree(model):
    from omegaconf import OmegaConf
    from pydantic import BaseModel

    class Cfg(BaseModel):
        type: str = "AdamW"
        lr: float = 2e-3

    forms = [
        {"type": "AdamW", "lr": 2e-3},
        {"optimizer": {"type": "adamw", "lr": 2e-3}},
        OmegaConf.create({"type": "AdamW", "lr": 2e-3}),
        OmegaConf.create({"optimizer": {"type": "AdamW", "lr": 2e-3}}),
        Cfg(),
        {"type": "AdamW", "optim_args": "lr=2e-3"},
    ]
    for form in forms:
        opt = optcore.build_optimizer(form, model)
        assert isinstance(opt, torch.optim.AdamW) and opt.get_lr() == pytest.approx(2e-3)
    assert optcore.build_optimizer("AdamW", model).get_lr() == 1e-3


def test_strings_are_parsed_safely(model):
    opt = optcore.build_optimizer({"type": "Adam", "lr": "1e-3", "betas": "(0.8, 0.98)", "amsgrad": "true"}, model)
    g = opt.param_groups[0]
    assert g["betas"] == (0.8, 0.98) and g["amsgrad"] is True
    with pytest.raises(optcore.ConfigError, match="betas"):
        optcore.build_optimizer({"type": "Adam", "betas": "__import__('os').system('echo pwned')"}, model)


def test_config_error_lists_every_field(model):
    with pytest.raises(optcore.ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW", "lr": -1, "betas": (0.9, 1.5), "eps": -1, "wieght_decay": 0.1}, model)
    err = info.value
    fields = {f.split(".")[0] for f, _ in err.problems}
    assert {"lr", "betas", "eps", "wieght_decay"} <= fields
    assert "weight_decay" in str(err) and "did you mean" in str(err)
    assert "weight_decay" in err.accepted


def test_optim_args_clash_is_an_error(model):
    with pytest.raises(optcore.ConfigError, match="given both"):
        optcore.build_optimizer({"type": "AdamW", "lr": 1e-3, "optim_args": "lr=1e-2"}, model)
    with pytest.raises(optcore.ConfigError, match="key=value"):
        optcore.build_optimizer({"type": "AdamW", "optim_args": "lr"}, model)


def test_param_groups_from_a_module(model):
    opt = optcore.build_optimizer({"type": "AdamW", "weight_decay": 0.1}, model)
    by_name = {g["name"]: g for g in opt.param_groups}
    assert by_name["decay"]["weight_decay"] == 0.1 and by_name["no_decay"]["weight_decay"] == 0.0
    decayed = {id(p) for p in by_name["decay"]["params"]}
    assert decayed == {id(model[0].weight), id(model[3].weight)}
    # no split when there is no decay, or when asked not to
    assert len(optcore.build_optimizer({"type": "SGD", "lr": 0.1}, model).param_groups) == 1
    assert len(optcore.build_optimizer({"type": "AdamW", "no_decay": False}, model).param_groups) == 1


def test_regex_param_groups_and_lr_scale(model):
    cfg = {"type": "AdamW", "lr": 1e-3, "weight_decay": 0.0,
           "param_groups": [{"params": r"^3\.", "lr_scale": 0.1, "name": "head"},
                            {"params": r"^0\.", "betas": "(0.5, 0.9)"}]}
    opt = optcore.build_optimizer(cfg, model)
    head = next(g for g in opt.param_groups if g.get("name") == "head")
    assert head["lr"] == pytest.approx(1e-4)
    assert any(g["betas"] == (0.5, 0.9) for g in opt.param_groups)
    opt.set_lr(2e-3)
    assert head["lr"] == pytest.approx(2e-4) and opt.get_lr() == pytest.approx(2e-3)


def test_overlapping_regexes_and_bad_group_values_are_errors(model):
    with pytest.raises(optcore.ConfigError, match="more than one"):
        optcore.build_optimizer({"type": "SGD", "param_groups": [{"params": "weight"}, {"params": r"^0\."}]}, model)
    with pytest.raises(optcore.ConfigError, match="lr"):
        optcore.build_optimizer({"type": "SGD", "param_groups": [{"params": "weight", "lr": -3}]}, model)
    with pytest.raises(optcore.ConfigError, match="regex"):
        optcore.build_optimizer({"type": "SGD", "param_groups": [{"params": "("}]}, model)


def test_params_forms(model):
    named = dict(model.named_parameters())
    model[1].weight.requires_grad_(False)
    for params in (model, model.parameters(), list(model.parameters()), named, list(named.items()),
                   [{"params": [model[0].weight]}, {"params": [model[3].weight], "lr": 0.5}]):
        opt = optcore.build_optimizer({"type": "SGD", "lr": 0.1}, params)
        ids = {id(p) for g in opt.param_groups for p in g["params"]}
        assert id(model[1].weight) not in ids, "frozen params are dropped"
    with pytest.raises(optcore.ConfigError, match="No trainable"):
        optcore.build_optimizer("SGD", [torch.zeros(2)])
    with pytest.raises(optcore.ConfigError, match="not a tensor"):
        optcore.build_optimizer("SGD", [1, 2, 3])
    with pytest.raises(optcore.ConfigError, match="by name"):
        optcore.build_optimizer({"type": "SGD", "param_groups": [{"params": "x"}]}, list(model.parameters()))


def test_fused_by_default_and_explicit_flags_respected(model):
    assert implementation_of(optcore.build_optimizer("AdamW", model)) == "fused"
    assert implementation_of(optcore.build_optimizer({"type": "AdamW", "foreach": True}, model)) == "foreach"
    assert implementation_of(optcore.build_optimizer({"type": "AdamW", "fused": False}, model)) != "fused"
    assert optcore.build_optimizer("AdamW", model).supports_step_with_scale is True
    assert optcore.build_optimizer({"type": "AdamW", "fused": False}, model).supports_step_with_scale is False
    with pytest.raises(optcore.ConfigError, match="exclusive"):
        optcore.build_optimizer({"type": "AdamW", "fused": True, "foreach": True}, model)


def test_fused_default_matches_torch_default_numerically(model):
    import copy

    m2 = copy.deepcopy(model)
    ours = optcore.build_optimizer({"type": "AdamW", "lr": 1e-2}, model)
    ref = torch.optim.AdamW(m2.parameters(), lr=1e-2, weight_decay=0.01)
    ours_groups = optcore.build_optimizer({"type": "AdamW", "lr": 1e-2, "no_decay": False}, model)
    del ours
    for _ in range(5):
        x = torch.randn(8, 4)
        for m, o in ((model, ours_groups), (m2, ref)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    for a, b in zip(model.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_precision_without_plugin_is_a_clear_error(model, monkeypatch):
    monkeypatch.setenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    import optcore._plugins as plugins

    plugins.refresh()
    try:
        with pytest.raises(optcore.ConfigError, match="optcore-fp16"):
            optcore.build_optimizer({"type": "AdamW", "precision": "fp16"}, model)
        # The core gives no meaning to precision values, not even fp32: the key is the plugin's.
        with pytest.raises(optcore.ConfigError, match="optcore-fp16"):
            optcore.plan({"type": "AdamW", "precision": "fp32", "lr": 1e-3})
    finally:
        monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD")
        plugins.refresh()


def test_a_plugin_key_nobody_claims_says_why_the_plugin_is_not_in_use(monkeypatch, fake_plugins):
    """Installed but switched off, installed but broken, or not installed: three fixes, three messages."""
    config = {"type": "AdamW", "lr": 1e-3, "precision": "fp16"}
    monkeypatch.setenv("OPTCORE_PLUGINS", "optcore-lion")
    with pytest.raises(optcore.ConfigError, match=r"optcore-fp16 is installed, but OPTCORE_PLUGINS='optcore-lion' leaves out its optcore.hooks entry points"):
        optcore.plan(config)
    monkeypatch.setenv("OPTCORE_PLUGINS", "optcore-lion,FP16Optimizer")  # the wrapper's entry point, not the hook's
    with pytest.raises(optcore.ConfigError, match=r"'optcore-lion,FP16Optimizer' leaves out its optcore.hooks entry"):
        optcore.plan(config)
    monkeypatch.setenv("OPTCORE_PLUGINS", "optcore-lion,optcore-fp16")
    assert optcore.plan(config).spec.name == "FP16Optimizer"
    monkeypatch.setenv("OPTCORE_PLUGINS", "fp16")  # the hook's entry point only: the key is claimed, the wrapper left out
    with pytest.raises(optcore.OptimizerNotFoundError, match="only the plugins OPTCORE_PLUGINS='fp16' names"):
        optcore.plan(config)
    monkeypatch.delenv("OPTCORE_PLUGINS")
    monkeypatch.setenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(optcore.ConfigError, match="installed, but OPTCORE_DISABLE_PLUGIN_AUTOLOAD is set") as info:
        optcore.plan(config)
    assert "pip install" not in str(info.value)
    with monkeypatch.context() as patch:
        patch.setattr("optcore._plan.PLUGIN_KEY_HINTS", {"precision": "optcore-not-installed"})
        with pytest.raises(optcore.ConfigError, match=r"Install it \(`pip install optcore-not-installed`") as info:
            optcore.plan(config)
        # installing it would not be enough: the switch would hide it too
        assert "discovery now finds no plugin: OPTCORE_DISABLE_PLUGIN_AUTOLOAD is set" in str(info.value)
        monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD")
        # a key of a plugin that is not installed (optcore-fp16, installed, claims only its own)
        patch.setattr("optcore._plan.PLUGIN_KEY_HINTS", {"sugar": "optcore-not-installed"})
        with pytest.raises(optcore.ConfigError, match=r"optcore-not-installed`, or .* repository\)\. Or drop the keys"):
            optcore.plan({"type": "AdamW", "sugar": 1})
        # installed and loaded, and its hooks claim nothing (an old version)
        fake_plugins("optcore-silent", "optcore_silent_hooks", "", {"optcore.hooks": {"silent": "optcore_silent_hooks"}})
        patch.setattr("optcore._plan.PLUGIN_KEY_HINTS", {"sugar": "optcore-silent"})
        with pytest.raises(optcore.ConfigError, match=r"optcore-silent is installed and loaded, and claims none of them"):
            optcore.plan({"type": "AdamW", "sugar": 1})
    # a broken plugin: its error is cleaned and cut for the message (no terminal escapes, no 3,000 characters)
    fake_plugins("optcore-broken", "optcore_broken_hooks", "raise RuntimeError('broken \\x1b[31m' + 'A' * 3000)",
                 {"optcore.hooks": {"broken": "optcore_broken_hooks"}})
    with monkeypatch.context() as patch:
        patch.setattr("optcore._plan.PLUGIN_KEY_HINTS", {"sugar": "optcore-broken"})
        with pytest.warns(RuntimeWarning, match="optcore-broken"):
            with pytest.raises(optcore.ConfigError, match=r"optcore-broken is installed and failed to load \(RuntimeError: broken ") as info:
                optcore.plan({"type": "AdamW", "sugar": 1})
    assert "\x1b" not in str(info.value) and len(str(info.value)) < 1000
    assert optcore._hooks.load_failure("OPTCORE_BROKEN") == optcore._hooks.load_failure("optcore-broken") is not None
    # a distribution named like the installed optcore-fp16, first on sys.path, is a look-alike: neither loads
    fake_plugins("optcore-fp16", "optcore_fp16_shadow", "raise RuntimeError('never imported')",
                 {"optcore.hooks": {"fp16": "optcore_fp16_shadow"}})
    with pytest.warns(RuntimeWarning, match="optcore.hooks:fp16 = optcore_fp16_shadow' is not loaded"):
        with pytest.raises(optcore.ConfigError, match=r"optcore-fp16 is installed and failed to load \(2 distributions on sys.path have one normalized name"):
            optcore.plan(config)
    assert "optcore_fp16_shadow" not in sys.modules


def test_constructor_errors_become_config_errors(model):
    def factory(params, lr=0.1):
        raise ValueError("this factory refuses")

    optcore.register_optimizer("Refuser", factory)
    try:
        with pytest.raises(optcore.ConfigError, match="refuses"):
            optcore.build_optimizer("Refuser", model)
    finally:
        optcore.unregister_optimizer("Refuser")


def test_factories_get_the_contract(model):
    def make(params, lr=0.1):
        return torch.optim.SGD(params, lr=lr)

    optcore.register_optimizer("MakeSGD", make)
    try:
        opt = optcore.build_optimizer({"type": "MakeSGD", "lr": 0.3}, model)
        assert isinstance(opt, torch.optim.SGD) and opt.get_lr() == 0.3 and hasattr(opt, "clip_grad_norm")
    finally:
        optcore.unregister_optimizer("MakeSGD")


def test_hook_plugins_contribute_policies_and_observe(fake_plugins, model):
    fake_plugins("optcore-policy", "optcore_policy_fake", """
import optcore.plugin
seen = []

@optcore.plugin.hookimpl
def optcore_param_group_policies(model, config):
    return [{"params": r"^3\\.", "lr_scale": 0.5, "name": "head"}]

@optcore.plugin.hookimpl
def optcore_optimizer_built(optimizer, config):
    seen.append(config["type"])
""", {"optcore.hooks": {"policy": "optcore_policy_fake"}})
    opt = optcore.build_optimizer({"type": "SGD", "lr": 0.2}, model)
    import optcore_policy_fake

    assert optcore_policy_fake.seen == ["SGD"]
    head = next(g for g in opt.param_groups if g.get("name") == "head")
    assert head["lr"] == pytest.approx(0.1)


def test_a_rewrite_hook_gets_each_optimizer_of_a_chain_and_its_mistakes_are_named(fake_plugins, model):
    fake_plugins("optcore-rewrite", "optcore_rewrite_fake", """
import optcore.plugin
seen = []

@optcore.plugin.hookimpl
def optcore_rewrite_config(config):
    seen.append(config["type"])
    if config.get("lr") == "bad":
        return ["not", "a", "config"]
    if config.get("lr") == "loop" and "optimizer" not in config:
        return {"type": "FP16Optimizer", "optimizer": dict(config)}  # wraps its own output again and again
    return None
""", {"optcore.hooks": {"rewrite": "optcore_rewrite_fake"}})
    import optcore_rewrite_fake

    with pytest.raises(optcore.ConfigError, match="optcore-rewrite.*not an optimizer config"):
        optcore.plan({"type": "SGD", "lr": "bad"})
    with pytest.raises(optcore.ConfigError, match="more than 8 deep.*rewrites its own output"):
        optcore.plan({"type": "SGD", "lr": "loop"})
    if not any(s.name == "FP16Optimizer" for s in optcore.list_optimizers()):
        return
    optcore_rewrite_fake.seen.clear()
    optcore.plan({"type": "FP16Optimizer", "optimizer": {"type": "SGD", "lr": 0.1}})
    assert optcore_rewrite_fake.seen == ["FP16Optimizer", "SGD"]  # each link once


def test_build_returns_optimizer_and_optional_scheduler(model):
    opt, sched = optcore.build({"optimizer": {"type": "SGD", "lr": 0.1}}, model)
    assert sched is None and isinstance(opt, torch.optim.SGD)
    with pytest.raises(optcore.ConfigError):
        optcore.build({"type": "SGD"}, model)


def _ruled() -> list[tuple[str, str, object, str]]:
    from optcore._torch_facts import PARAM_RULES

    torch_names = {spec.name for spec in optcore.list_optimizers() if spec.source == "torch"}
    return [(name, *rule) for name, rules in PARAM_RULES.items() if name in torch_names for rule in rules]


def _breaking(attr: str) -> torch.Tensor:
    """A parameter that breaks one rule and keeps the others (a real, dense matrix otherwise)."""
    if attr == "ndim":
        return torch.zeros(3, requires_grad=True)
    if attr == "is_complex":
        return torch.zeros(3, 3, dtype=torch.complex64, requires_grad=True)
    if attr == "is_sparse":
        return torch.zeros(3, 3).to_sparse().requires_grad_()
    raise AssertionError(f"no breaking tensor for rule {attr!r}: add one")


def test_torchs_param_rules_are_known_for_muon_sparseadam_and_adafactor():
    assert {name for name, *_ in _ruled()} >= {"Muon", "SparseAdam", "Adafactor"}


@pytest.mark.parametrize(("name", "attr", "wanted", "text"), _ruled(), ids=lambda v: str(v))
def test_a_rule_on_the_parameters_is_what_torch_enforces(name, attr, wanted, text):
    """The data is torch's own behaviour: the class itself refuses a parameter
    breaking the rule, in its constructor or at its first step."""
    p = _breaking(attr)
    with pytest.raises((ValueError, RuntimeError)):
        opt = getattr(torch.optim, name)([p], lr=0.01)
        p.grad = torch.zeros_like(p)
        opt.step()


@pytest.mark.parametrize(("name", "attr", "wanted", "text"), _ruled(), ids=lambda v: str(v))
@pytest.mark.parametrize("form", ["model", "dict", "list"])
def test_parameters_a_class_cannot_take_are_named_as_such(name, attr, wanted, text, form):
    """Muon over a model with biases, and every rule of every torch class: one
    ConfigError naming the parameters and the rule as one on the parameters (not
    a value to fix), from plan and build alike, before any constructor runs."""
    good = torch.nn.Parameter(torch.zeros(4, 4))
    bad = _breaking(attr)
    if form == "model":
        model = torch.nn.Module()
        model.weight, model.odd = good, torch.nn.Parameter(bad)
        params, shown = model, "'odd'"
    elif form == "dict":
        params, shown = {"weight": good, "odd": bad}, "'odd'"
    else:
        params, shown = [good, bad], "#1"
    for road in (optcore.plan, optcore.build_optimizer):
        with pytest.raises(optcore.ConfigError) as err:
            road({"type": f"torch:{name}", "lr": 0.01}, params)
        message = str(err.value)
        assert f"{name} takes" in message and "a constraint on the parameters" in message
        assert f"1 of the 2 parameters breaks '{text}': {shown}" in message
        assert "Fix the value" not in message and "another optimizer" in message
        assert err.value.problems and err.value.problems[0][0] == "params"


def test_muon_takes_the_matrices_of_a_model_with_biases_when_given_them():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with pytest.raises(optcore.ConfigError, match=r"2 of the 4 parameters break '2-D parameters only.*'0.bias'.*'1.bias'"):
        optcore.build_optimizer({"type": "Muon", "lr": 0.02}, model)
    matrices = {n: p for n, p in model.named_parameters() if p.ndim == 2}
    assert isinstance(optcore.build_optimizer({"type": "Muon", "lr": 0.02}, matrices), torch.optim.Muon)


def test_a_constructors_refusal_is_not_called_a_bad_value():
    """A class optcore has no rule for refuses a parameter in its constructor:
    the message says it may be about the parameters, not only a value."""

    class Picky(torch.optim.SGD):
        def __init__(self, params, lr=0.1):
            super().__init__(params, lr=lr)
            if any(p.ndim != 2 for g in self.param_groups for p in g["params"]):
                raise ValueError("Picky takes matrices only")

    with pytest.raises(optcore.ConfigError) as err:
        optcore.build_optimizer({"type": Picky}, [torch.zeros(3, requires_grad=True)])
    assert "Picky takes matrices only" in str(err.value) and "the parameters it was given" in str(err.value)
    assert "Fix the value it names" not in str(err.value)
