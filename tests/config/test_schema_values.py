"""What a hyper-parameter value may be: finite real numbers (not booleans),
strict switches, 0-dim tensor learning rates; and how bad values and unknown
fields are reported (cut, escaped, with the right suggestion)."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch

import optcore
from optcore import ConfigError
from optcore._fields import LR, HParams
from optcore._schema import schema_from_signature, validate_hparams
from optcore._torch_optims import torch_schema


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))


NON_FINITE = [math.inf, -math.inf, math.nan, "inf", "1e999", "nan", "-inf"]


@pytest.mark.parametrize("field", ["lr", "eps", "weight_decay"])
@pytest.mark.parametrize("value", NON_FINITE, ids=repr)
def test_non_finite_hyper_parameters_are_config_errors(model, field, value):
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW", field: value}, model)
    assert [f for f, _ in info.value.problems] == [field]
    assert "finite" in str(info.value) or "number" in str(info.value)


@pytest.mark.parametrize("name", ["lion_pytorch:Lion", "optimi:AdamW", "pytorch_optimizer:Lamb", "torch:SGD"])
def test_non_finite_lr_is_refused_for_signature_derived_schemas_too(model, name):
    pytest.importorskip(name.split(":")[0].split(".")[0])
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match="lr"):
        optcore.build_optimizer({"type": name, "lr": "1e999"}, model)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("value", [True, False, "true", "false"])
def test_a_boolean_is_not_a_number(model, value):
    with pytest.raises(ConfigError, match="boolean") as info:
        optcore.build_optimizer({"type": "AdamW", "lr": value}, model)
    assert [f for f, _ in info.value.problems] == ["lr"]
    with pytest.raises(ConfigError, match="boolean"):
        optcore.build_optimizer({"type": "SGD", "momentum": value}, model)


def test_a_boolean_is_not_a_beta_either(model):
    with pytest.raises(ConfigError, match="betas"):
        optcore.build_optimizer({"type": "AdamW", "betas": [True, 0.9]}, model)


def test_switches_take_booleans_and_their_names_only(model):
    opt = optcore.build_optimizer({"type": "Adam", "amsgrad": "false", "maximize": "TRUE"}, model)
    assert opt.param_groups[0]["amsgrad"] is False and opt.param_groups[0]["maximize"] is True
    for junk in [1, 0, "yes", "no", "0", "", [], 0.0]:
        with pytest.raises(ConfigError, match="amsgrad"):
            optcore.build_optimizer({"type": "Adam", "amsgrad": junk}, model)


def test_signature_schemas_have_finite_floats_and_strict_flags():
    class Opt(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, clip=math.inf, steps=3, flag=False, betas=(0.9, 0.99)):
            super().__init__(params, {"lr": lr})

    schema = schema_from_signature(Opt)
    for bad in ({"lr": math.inf}, {"lr": True}, {"flag": "false-ish"}, {"flag": 1}, {"steps": True},
                {"betas": (0.9, math.nan)}):
        with pytest.raises(ConfigError):
            validate_hparams(schema, bad, "Opt")
    good = validate_hparams(schema, {"flag": "false", "clip": math.inf, "steps": 4, "betas": "(0.8, 0.9)"}, "Opt")
    assert good["flag"] is False and good["clip"] == math.inf and good["steps"] == 4 and good["betas"] == (0.8, 0.9)


def test_annotated_signatures_are_strict_too():
    class Opt(torch.optim.Optimizer):
        def __init__(self, params, lr: float = 1e-3, amsgrad: bool = False, scale: float | None = None):
            super().__init__(params, {"lr": lr})

    schema = schema_from_signature(Opt)
    for bad in ({"lr": "inf"}, {"amsgrad": "no"}, {"scale": math.nan}, {"scale": True}):
        with pytest.raises(ConfigError):
            validate_hparams(schema, bad, "Opt")
    assert validate_hparams(schema, {"amsgrad": "true", "scale": None}, "Opt")["amsgrad"] is True


def test_a_0_dim_tensor_lr_passes_through_unchanged():
    class Cfg(HParams):
        lr: LR = 1e-3

    lr = torch.tensor(0.01)
    assert validate_hparams(Cfg, {"lr": lr}, "X")["lr"] is lr
    assert validate_hparams(torch_schema("AdamW"), {"lr": lr}, "AdamW")["lr"] is lr
    for bad in (torch.tensor([0.01]), torch.tensor(1), torch.tensor(math.nan), torch.tensor(-1.0)):
        with pytest.raises(ConfigError, match="lr"):
            validate_hparams(Cfg, {"lr": bad}, "X")


def test_long_values_are_cut_in_messages(model):
    huge = "x" * 10_000_000
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW", "lr": huge}, model)
    message = str(info.value)
    assert len(message) < 2000 and "…(10000000 chars)" in message
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW", "lr": list(range(100_000))}, model)
    assert len(str(info.value)) < 2000


def test_control_characters_are_escaped_in_messages(model):
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW", "lr": "\x1b[31mred\x07", "\x1b[2Jkey": 1}, model)
    message = str(info.value)
    assert "\x1b" not in message and "\x07" not in message
    assert "\\x1b[31mred" in message and "\\x1b[2Jkey" in message


@pytest.mark.parametrize(
    ("field", "expected"),
    [("wd", "weight_decay"), ("learning_rate", "lr"), ("epsilon", "eps"), ("beta1", "betas"), ("beta2", "betas"),
     ("weight_decay_rate", "weight_decay")],
)
def test_common_aliases_are_suggested(model, field, expected):
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW", field: 0.1}, model)
    assert info.value.problems == [(field, f"unknown field; did you mean {expected!r}?")]


def test_an_optimizer_without_a_well_known_field_says_so(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError) as info:
            optcore.build_optimizer({"type": "lion_pytorch:Lion", "eps": 1e-8}, model)
    [(field, message)] = info.value.problems
    assert field == "eps" and "Lion has no 'eps'" in message and "betas" not in message
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "SGD", "epsilon": 1e-8}, model)
    assert "SGD has no 'epsilon' (eps)" in info.value.problems[0][1]


def test_aliases_point_to_the_optimizers_own_spelling(model):
    pytest.importorskip("transformers")
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "transformers.optimization:Adafactor", "betas": (0.9, 0.99)}, model)
    assert info.value.problems == [("betas", "unknown field; did you mean 'beta1'?")]


def test_typos_still_get_close_matches(model):
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW", "weight_dacay": 0.1}, model)
    assert "did you mean 'weight_decay'?" in info.value.problems[0][1]


def test_every_argument_of_torch_optimizers_has_its_constraint():
    """A torch upgrade that adds an argument fails here (give it a type in
    optcore._torch_optims.FIELDS) instead of reaching users loosely typed."""
    from optcore._torch_facts import TORCH_FACTS
    from optcore._torch_optims import FIELDS, OWN_FIELDS

    for name in TORCH_FACTS:
        cls = getattr(torch.optim, name, None)
        if cls is None:  # older torch: Adafactor (2.5), Muon (2.9)
            continue
        arguments = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
        assert arguments <= set(FIELDS) | set(OWN_FIELDS.get(name, {})), name
        schema = torch_schema(name)
        assert list(schema.model_fields) == [a for a in inspect.signature(cls.__init__).parameters if a in arguments]
        assert all(info.default == inspect.signature(cls.__init__).parameters[k].default
                   for k, info in schema.model_fields.items()), name


def test_a_torch_argument_pydantic_cannot_type_leaves_the_others_typed(monkeypatch):
    """A newer torch's argument annotated with a Callable (no JSON schema) is
    accepted as is; lr and the rest keep their constraints."""
    from collections.abc import Callable

    class SGDNext(torch.optim.SGD):
        def __init__(self, params, lr=1e-3, momentum=0.0, grad_hook=None):
            super().__init__(params, lr, momentum)

    SGDNext.__init__.__annotations__ = {"grad_hook": Callable[[torch.Tensor], torch.Tensor] | None}  # not strings
    monkeypatch.setattr(torch.optim, "SGDNext", SGDNext, raising=False)
    schema = torch_schema.__wrapped__("SGDNext")
    assert validate_hparams(schema, {"grad_hook": abs}, "SGDNext")["grad_hook"] is abs
    for bad in ({"lr": -1}, {"momentum": "abc"}):
        with pytest.raises(ConfigError):
            validate_hparams(schema, bad, "SGDNext")


def test_a_torch_without_an_argument_gets_a_schema_without_it(monkeypatch):
    """torch 2.4's Adam has no decoupled_weight_decay: its schema must not pass one."""

    class Adam24(torch.optim.Adam):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                     foreach=None, maximize=False, capturable=False, differentiable=False, fused=None):
            super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                             capturable=capturable, differentiable=differentiable, fused=fused)

    monkeypatch.setattr(torch.optim, "Adam", Adam24)
    schema = torch_schema.__wrapped__("Adam")
    assert "decoupled_weight_decay" not in schema.model_fields and "fused" in schema.model_fields
    kwargs = validate_hparams(schema, {"lr": "3e-4", "betas": "(0.8, 0.9)"}, "Adam")
    Adam24([torch.zeros(2, requires_grad=True)], **kwargs)
    with pytest.raises(ConfigError, match="exclusive"):
        validate_hparams(schema, {"fused": True, "foreach": True}, "Adam")
