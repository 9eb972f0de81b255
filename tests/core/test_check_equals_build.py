"""``optcore check`` passes exactly the configs that build: its verdict on a
config is the build's, for torch's classes, third-party classes whose derived
schemas carry no constraints (their constructors judge), plugins, and the
precision plugin's keys (a wrapper judges its inner optimizer and its options).

The configs are targeted: each draws the fields of its own optimizer's schema,
with values at the edges of what constructors accept, plus plugin keys and
regex ``param_groups`` that match the model, so almost every example reaches a
constructor. ``check`` itself stays free of side effects: no file written, no
hook called, nothing allocated on a device.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optcore
from optcore.cli import check_config

TORCH = ["SGD", "AdamW", "Adam", "Adagrad", "RMSprop", "NAdam", "RAdam", "Adamax", "Adadelta", "ASGD", "Rprop"]
THIRD_PARTY = [("lion_pytorch", ["lion_pytorch:Lion"]),
               ("pytorch_optimizer", ["pytorch_optimizer:Lamb", "pytorch_optimizer:AdaBelief", "pytorch_optimizer:Prodigy"]),
               ("optimi", ["optimi:AdamW", "optimi:Lion"]),
               ("transformers", ["transformers.optimization:Adafactor"])]
PLUGINS = ["optcore-lion:Lion", "optcore-adafactor:Adafactor", "optcore-adascale:AdaScaleSGD"]
NAMES = TORCH + [n for module, names in THIRD_PARTY if importlib.util.find_spec(module) for n in names] + PLUGINS
#: switches whose values pick a device kernel or autograd mode: not the constructors' arguments checks
SKIP_FIELDS = {"differentiable", "capturable", "compiled", "use_triton", "foreach", "implementation"}
REGEXES = ["^0\\.weight$", "^1\\."]  # each matches parameters of model()

edge = st.sampled_from([0, 0.0, -1, -1e-8, 1e-12, 1e-3, 0.5, 0.999, 1, 1.5, 2, 10, 1e30])


def model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)).to(dtype)


def _value(default):
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, (int, float)):
        return edge
    if isinstance(default, tuple):
        return st.tuples(*[edge] * len(default)) | st.tuples(edge) | st.lists(edge, min_size=len(default),
                                                                            max_size=len(default))
    if default is None:
        return edge | st.booleans() | st.none()
    if isinstance(default, str):
        return st.sampled_from([default, "bogus"])
    return st.just(default)


@functools.cache
def fields_of(name: str) -> dict:
    schema = optcore.resolve(name).schema
    return {k: _value(info.default) for k, info in schema.model_fields.items()
            if k not in SKIP_FIELDS and not info.is_required()}


@st.composite
def configs(draw):
    name = draw(st.sampled_from(NAMES))
    fields = fields_of(name)
    keys = sorted(fields)
    config = {"type": name}
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)) if keys else []:
        config[key] = draw(fields[key])
    precision = draw(st.sampled_from([None, None, "fp16", "bf16"]))
    if precision:
        config["precision"] = precision
        if draw(st.booleans()):
            config["memory_efficient"] = draw(st.booleans())
        if draw(st.booleans()):
            config["loss_scaler"] = draw(st.sampled_from([{}, {"init_scale": 1024.0}, {"init_scale": -1.0},
                                                          {"scale_window": 0}, {"min_scale": 2.0}]))
    if draw(st.booleans()):
        groups = []
        for regex in draw(st.lists(st.sampled_from(REGEXES), min_size=1, max_size=2, unique=True)):
            group = {"params": regex}
            for key in draw(st.lists(st.sampled_from(keys), max_size=2, unique=True)) if keys else []:
                group[key] = draw(fields[key])
            if draw(st.booleans()):
                group["lr_scale"] = draw(edge)
            groups.append(group)
        config["param_groups"] = groups
    return config


def build_verdict(config) -> str | None:
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.get("precision"), torch.float32)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optcore.build_optimizer(config, model(dtype))
    except optcore.OptcoreError as exc:
        return str(exc)
    return None


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")  # a plugin's import seeds random
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(config=configs())
def test_check_passes_exactly_what_builds(config):
    checked, built = check_config(config), build_verdict(config)
    assert (not checked) == (built is None), f"{config}\ncheck: {checked}\nbuild: {built}"


@pytest.mark.parametrize("config", [
    {"type": "lion_pytorch:Lion", "lr": -1, "betas": [0.9, 1.5]},  # a derived schema, the constructor's assert
    {"type": "AdamW", "precision": "bf16", "loss_scaler": {}},  # bf16 takes no loss scaler
    {"type": "pytorch_optimizer:Lamb", "betas": [0.9, 1.5]},
    # a fill its dtype cannot hold: the CPU refuses it, a meta tensor (no data) would not
    {"type": "Adagrad", "precision": "fp16", "initial_accumulator_value": 1e30},
    {"type": "Adagrad", "initial_accumulator_value": 1e39},
], ids=["lion-pytorch-assert", "bf16-loss-scaler", "lamb-betas", "fp16-overflowing-fill", "fp32-overflowing-fill"])
def test_check_refuses_what_only_a_constructor_refuses(config):
    if ":" in config["type"]:
        pytest.importorskip(config["type"].split(":")[0])
    refused = build_verdict(config)
    assert refused is not None
    assert check_config(config) == [refused]  # the build's own message


@pytest.mark.parametrize("config", [
    {"type": "AdamW", "fused": True},  # torch's fused kernel has no meta implementation: tried on the CPU
    {"type": "Muon", "lr": 0.02},  # 2-D parameters only: the stand-ins are matrices
    {"type": "Adagrad", "precision": "fp16"},  # its constructor's state is made again over the fp32 copy
    {"type": "Adagrad", "precision": "bf16"},
    {"type": "AdamW", "precision": "fp16", "loss_scaler": {"init_scale": 1024.0}},
    {"type": "optcore-adafactor:Adafactor", "param_groups": [{"params": "x", "weight_decay": 0.1}]},
])
def test_check_passes_configs_that_build(config):
    assert check_config(config) == []


def test_check_writes_nothing_calls_no_hook_and_allocates_only_tiny_cpu_stand_ins(tmp_path, monkeypatch, fake_plugins):
    """The trial construction is no build: the built hook is not called, no file is
    written (cache and working directory), and the stand-ins are four-element CPU
    tensors (the CPU build's verdict, at no cost)."""
    from optcore import _build

    fake_plugins("optcore-built-spy", "optcore_built_spy", """
from optcore.plugin import hookimpl
seen = []

@hookimpl
def optcore_optimizer_built(optimizer, config):
    seen.append(config["type"])
""", {"optcore.hooks": {"spy": "optcore_built_spy"}})
    import optcore_built_spy

    sandbox = tmp_path / "sandbox"
    work = sandbox / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("OPTCORE_CACHE_DIR", str(sandbox / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(sandbox / "xdg"))
    devices = []
    real_call = _build._call

    def spy(spec, groups, kwargs):
        devices.extend((p.device.type, p.numel()) for g in groups for p in g["params"])
        return real_call(spec, groups, kwargs)

    monkeypatch.setattr(_build, "_call", spy)
    for config in ({"type": "AdamW", "lr": 1e-3, "param_groups": [{"params": "^head", "lr_scale": 0.1}]},
                   {"type": "optcore-lion:Lion", "precision": "bf16"}, {"type": "optcore-adafactor:Adafactor"},
                   {"type": "lion_pytorch:Lion"}):
        assert check_config(config) == []
    assert optcore_built_spy.seen == []
    assert devices and set(devices) == {("cpu", 4)}
    assert os.listdir(sandbox) == ["work"] and os.listdir(work) == []
    optcore.build_optimizer({"type": "SGD", "lr": 0.1}, model())
    assert optcore_built_spy.seen == ["SGD"]  # the spy hears a build
