"""optcore.plan: one road for build, check, show --config and the CLI flags."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optcore
from optcore._build import construct
from optcore.cli import check_config, main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))


def test_plan_is_frozen_and_complete_before_construction():
    config = {"type": "AdamW", "lr": 1e-3, "betas": "(0.9, 0.98)", "param_groups": [{"params": r"^1\.", "lr_scale": 0.5}]}
    plan = optcore.plan(config)
    assert plan.spec.qualified == "torch:AdamW" and plan.groups is None
    assert plan.hparams["betas"] == (0.9, 0.98) and plan.explicit == {"lr", "betas"}
    with pytest.raises(TypeError):
        plan.hparams["lr"] = 1.0  # read-only
    with_params = optcore.plan(config, model())
    assert len(with_params.groups) == 3 and all(g["params"] for g in with_params.groups)
    assert with_params.groups[-1]["lr"] == pytest.approx(5e-4) and with_params.implementation == "fused"
    assert config["betas"] == "(0.9, 0.98)"  # the caller's config is untouched
    opt = construct(with_params)
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["fused"] is True


def test_check_validates_group_overrides_as_the_build_does():
    bad = {"type": "SGD", "lr": 0.1, "param_groups": [{"params": "^0", "momentum": -1}]}
    with pytest.raises(optcore.ConfigError, match="momentum"):
        optcore.build_optimizer(bad, model())
    assert check_config(bad) and "momentum" in check_config(bad)[0]
    assert check_config({"type": "SGD", "param_groups": [{"params": "("}]})  # a broken regex
    assert check_config({"type": "SGD", "optim_args": {"lr": -1}})  # a mapping optim_args is checked too
    assert check_config({"type": "SGD", "no_decay": "yes"})


def test_show_config_prints_the_plan(tmp_path, capsys):
    path = tmp_path / "opt.json"
    path.write_text(json.dumps({"optimizer": {"type": "SGD", "lr": 0.1, "momentum": 0.9}}))
    assert main(["show", "--config", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["type"] == "torch:SGD" and shown["hparams"]["momentum"] == 0.9
    assert set(shown["explicit"]) == {"lr", "momentum"}


def _example_configs() -> list[tuple[str, object]]:
    from optcore.files import load_config_file

    out = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        if "lr_scheduler" in path.parts:
            continue  # Hydra's scheduler config group
        data = load_config_file(path)
        if "_target_" in str(data):
            continue  # a Hydra instantiate config: the example's own test builds it
        if isinstance(data, dict) and "optimizer" in data:
            out.append((path.name, data["optimizer"]))
        elif isinstance(data, dict) and "type" in data:
            out.append((path.name, data))
        elif isinstance(data, dict) and isinstance(data.get("configs"), list):
            out += [(f"{path.name}[{i}]", c.get("optimizer", c)) for i, c in enumerate(data["configs"]) if isinstance(c, dict)]
    return out


@pytest.mark.parametrize(("name", "config"), _example_configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_example_config_checks_and_builds(name, config):
    assert check_config(config) == []
    dtype = optcore.plan(config).param_dtype
    net = model().to(dtype) if dtype else model()
    assert isinstance(optcore.build_optimizer(config, net), torch.optim.Optimizer)


NAMES = ["AdamW", "SGD", "Adam", "RMSprop", "Adagrad", "NAdam", "optcore-lion:Lion", "optcore-adafactor:Adafactor", "nope"]
NUMBERS = st.one_of(st.floats(-1, 2), st.sampled_from([0.0, 1e-3, 0.9, "1e-3", "(0.9, 0.99)", True, None, "x", [0.9, 0.99]]))
KEYS = ["lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "dampening", "amsgrad", "maximize", "beta1", "wd"]
CONFIGS = st.fixed_dictionaries(
    {"type": st.sampled_from(NAMES)},
    optional={k: NUMBERS for k in KEYS}
    | {"param_groups": st.lists(st.fixed_dictionaries({"params": st.sampled_from(["^0", "^1", "("])}, optional={"lr": NUMBERS}), max_size=2)},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS)
def test_check_and_build_agree(config):
    """torch's classes and the plugins validate everything in their schemas, so
    for them check's verdict is the build's (third-party classes may still
    reject a value in their constructor, which check cannot run)."""
    accepted = not check_config(dict(config))
    try:
        optcore.build_optimizer(dict(config), model())
    except optcore.OptcoreError:
        built = False
    else:
        built = True
    assert accepted == built, config


def test_import_paths_can_be_turned_off_on_every_entry_point(monkeypatch):
    path = {"type": "torch.optim:SGD", "lr": 0.1}
    assert optcore.plan(path).spec.target is torch.optim.SGD
    for call in (
        lambda: optcore.plan(path, allow_import_paths=False),
        lambda: optcore.build_optimizer(path, model(), allow_import_paths=False),
        lambda: optcore.build({"optimizer": path}, model(), allow_import_paths=False),
        lambda: optcore.build(
            {"optimizer": {"type": "SGD"}, "lr_scheduler": {"type": "torch.optim.lr_scheduler:StepLR", "step_size": 2}},
            model(),
            allow_import_paths=False,
        ),
    ):
        with pytest.raises(optcore.ConfigError, match="import path"):
            call()
    assert check_config(path, allow_import_paths=False)
    monkeypatch.setenv("OPTCORE_ALLOW_IMPORT_PATHS", "0")
    assert check_config(path) and not check_config({"type": "SGD"})


def test_differentiable_steps_non_leaf_params_as_torch_does():
    """differentiable=True: autograd through the step (meta-learning), over a
    non-leaf parameter, exactly as torch.optim.SGD(differentiable=True)."""
    grads = []
    for build in (
        lambda w: optcore.build_optimizer({"type": "SGD", "lr": 0.1, "momentum": 0.9, "differentiable": True}, [w]),
        lambda w: torch.optim.SGD([w], lr=0.1, momentum=0.9, differentiable=True),
    ):
        w0 = torch.ones(3, requires_grad=True)
        w = w0 * 2.0  # not a leaf
        w.retain_grad()
        (w**2).sum().backward(create_graph=True)
        opt = build(w)
        opt.step()
        (w**3).sum().backward()  # through the update, back to w0
        grads.append(w0.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    with pytest.raises(optcore.ConfigError, match="not a leaf"):
        optcore.build_optimizer({"type": "SGD"}, [torch.ones(3, requires_grad=True) * 2.0])


def test_a_bad_field_for_a_shadowed_name_names_the_other_providers():
    """Plain 'Adafactor' is torch's (torch.optim comes first); a Hugging Face
    field on it is an error that says which Adafactor it was and which else is installed."""
    pytest.importorskip("optcore_adafactor")
    with pytest.raises(optcore.ConfigError) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore", optcore._registry.ShadowedNameWarning)  # said once per process
        optcore.plan({"type": "Adafactor", "beta1": 0.9})
    message = str(caught.value)
    assert "unknown field" in message and "'Adafactor' resolved to torch:Adafactor (torch)" in message
    assert "'optcore-adafactor:Adafactor'" in message and caught.value.problems[0][0] == "beta1"


def test_an_optimizer_key_on_a_class_that_wraps_nothing_is_named():
    """``{"type": X, "optimizer": ...}`` is the wrapper form (API.md); for a class
    that declares no ``wraps_optimizer`` the error says so, from plan and check alike."""
    config = {"type": "AdamW", "optimizer": {"type": "SGD"}}
    with pytest.raises(optcore.ConfigError, match="AdamW is not a wrapper optcore builds") as info:
        optcore.plan(dict(config))
    assert info.value.problems[0][0] == "optimizer"
    assert "not a wrapper" in check_config(dict(config))[0]


# ------------------------------------------------------------------ bare tensors from DeepSpeed's optimizer callable
def _under_deepspeed_callable(monkeypatch, owner: torch.nn.Module) -> None:
    """As inside ``deepspeed.initialize(optimizer=callable)``: the engine's model
    is found on the stack (the real frame is tested on gloo ranks in
    tests/integrations/test_integrations_deepspeed.py)."""
    monkeypatch.setattr("optcore._plan.deepspeed_client_model", lambda: owner)


def test_bare_tensors_outside_deepspeed_are_one_decayed_group_as_torch_makes():
    m = model()
    opt = optcore.build_optimizer({"type": "AdamW", "weight_decay": 0.1}, m.parameters())
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1]


def test_bare_tensors_from_deepspeeds_callable_are_refused_where_names_change_the_groups(monkeypatch):
    m = model()
    _under_deepspeed_callable(monkeypatch, m)
    with pytest.raises(optcore.ConfigError, match=r"3 of the 4 parameters \('0.bias', '1.weight', '1.bias'\)"):
        optcore.build_optimizer({"type": "AdamW", "weight_decay": 0.1}, m.parameters())
    composite = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4, bias=False))
    _under_deepspeed_callable(monkeypatch, composite)
    no_names = pytest.warns(UserWarning, match="given without a name")  # the composite's own warning
    with pytest.raises(optcore.ConfigError, match=r"'0.weight' gets optimizer=.*AdamW.* over the model and .*Muon"), no_names:
        optcore.plan({"type": "torch:Muon", "lr": 0.02, "fallback": {"type": "AdamW"}}, list(composite.parameters()))


def test_bare_tensors_from_deepspeeds_callable_build_where_names_change_nothing(monkeypatch):
    m = model()
    _under_deepspeed_callable(monkeypatch, m)
    for config in ({"type": "AdamW", "weight_decay": 0.1, "no_decay": False}, {"type": "AdamW", "weight_decay": 0.0}):
        opt = optcore.build_optimizer(config, (p for p in m.parameters()))  # an iterator, read once
        assert [len(g["params"]) for g in opt.param_groups] == [4]
    named = optcore.build_optimizer({"type": "AdamW", "weight_decay": 0.1}, m.named_parameters())  # names given
    assert sorted(g["weight_decay"] for g in named.param_groups) == [0.0, 0.1]
    other = torch.nn.Linear(2, 2)  # tensors that are not the engine's model's: nothing to compare with
    assert len(optcore.build_optimizer({"type": "AdamW", "weight_decay": 0.1}, other.parameters()).param_groups) == 1
