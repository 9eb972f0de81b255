"""Every JSON/YAML value shape in every position of a config's ``param_groups``:
the value itself, each entry, each key of an entry. Only OptcoreErrors escape,
and ``optcore.plan``, ``optcore check`` and the build judge each config alike.

Optimizers of every origin: torch's, third-party classes with derived schemas,
and plugins (whose ``add_param_group`` validates a group's values itself).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import optcore
from optcore.cli import check_config

OPTIMIZERS = ["SGD", "AdamW", "Adagrad", "lion_pytorch:Lion", "pytorch_optimizer:Lamb", "optcore-lion:Lion",
              "optcore-adafactor:Adafactor"]

scalars = (
    st.integers(-3, 3) | st.floats(allow_nan=True, allow_infinity=True) | st.booleans() | st.none()
    | st.text(max_size=5) | st.sampled_from(["0.9", "(0.9, 0.95)", "true", "1e-3", "^0\\.", "[0.9, 0.95]"])
)
#: every shape a JSON or YAML value takes: scalars, lists, nested lists, mappings, and the empty ones
shapes = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.lists(st.lists(scalars, max_size=2), max_size=2),
    st.dictionaries(st.sampled_from(["params", "lr", "type", "a", "0"]), scalars, max_size=2),
    st.sampled_from([[], {}, [[]], [{}], [0.9, 0.95], {"type": "SGD", "lr": 0.1}]),
)
#: keys of a group: its regex, its meta keys, hyper-parameters, a per-group optimizer, an unknown one
GROUP_KEYS = ["params", "name", "lr_scale", "optional", "lr", "betas", "weight_decay", "eps", "momentum", "optimizer",
              "foo"]
#: regexes that each match one parameter of MODEL, so no verdict depends on the model's names
REGEXES = ["^0\\.weight$", "bias$"]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 2))


group = st.builds(
    lambda regex, extra: {"params": regex, **extra},
    st.sampled_from(REGEXES),
    st.dictionaries(st.sampled_from(GROUP_KEYS), shapes, max_size=3),
)
param_groups = st.one_of(
    shapes,  # the value of param_groups itself
    st.lists(shapes, min_size=1, max_size=2),  # its entries
    st.lists(group, min_size=1, max_size=2, unique_by=lambda g: g["params"] if isinstance(g["params"], str) else id(g)),
)


def verdict(fn) -> str | None:
    """``None`` when ``fn()`` succeeds, the error's first line when it raises an OptcoreError;
    any other exception fails the test."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except optcore.OptcoreError as exc:
        return str(exc).splitlines()[0] or type(exc).__name__
    return None


def names_decide(groups) -> bool:
    """Whether a verdict depends on MODEL's parameter names: a group whose regex is
    not one of REGEXES (an entry's own ``params`` overrides the drawn one) may match
    none of them (an error unless ``optional``) or another group's parameters (an
    error). Only ``plan`` with the model and the build see the names; ``plan``
    without it and ``check`` pass such a config (docs/architecture.md)."""
    return isinstance(groups, list) and any(
        isinstance(g, Mapping) and isinstance(g.get("params"), str) and g["params"] not in REGEXES for g in groups
    )


@pytest.mark.parametrize("name", OPTIMIZERS)
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(groups=param_groups)
@example(groups=[{"params": "^nomatch$", "lr": 0.1}])  # matches no parameter of MODEL
@example(groups=[{"params": "^nomatch$", "optional": True}])
@example(groups=[{"params": "", "lr": 0.1}, {"params": "bias$"}])  # "" matches 0.bias too
def test_param_group_values_of_every_shape(name, groups):
    config = {"type": name, "lr": 1e-3, "weight_decay": 0.01, "param_groups": groups}
    built = verdict(lambda: optcore.build_optimizer(config, model()))
    planned_over_model = verdict(lambda: optcore.plan(config, model()))
    planned = verdict(lambda: optcore.plan(config))
    checked = check_config(config)
    assert (planned_over_model is None) == (built is None), (config, planned_over_model, built)
    if names_decide(groups):  # without the names, neither refuses more than the build
        assert planned is None or built is not None, (config, planned, built)
        assert not checked or built is not None, (config, checked, built)
        return
    assert (planned is None) == (built is None), (config, planned, built)
    assert (not checked) == (built is None), (config, checked, built)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_regex_that_matches_no_parameter_is_refused_where_the_names_are_known(name):
    """The documented rule (optcore._group_rules, docs/architecture.md): a group
    whose regex matches no parameter is a ConfigError when the parameters are at
    hand, unless ``"optional": true``; ``plan`` without them and ``check`` cannot
    see the names and pass it."""
    config = {"type": name, "param_groups": [{"params": "^nomatch$", "weight_decay": 0.0}]}
    for fn in (lambda: optcore.plan(config, model()), lambda: optcore.build_optimizer(config, model())):
        with pytest.raises(optcore.ConfigError, match="matches no trainable parameter") as info:
            fn()
        assert info.value.problems == [("param_groups[0].params", "matches no parameter")]
    assert verdict(lambda: optcore.plan(config)) is None
    assert check_config(config) == []
    optional = {**config, "param_groups": [{"params": "^nomatch$", "weight_decay": 0.0, "optional": True}]}
    assert check_config(optional) == []
    opt = optcore.build_optimizer(optional, model())
    assert sum(len(g["params"]) for g in opt.param_groups) == 2


@pytest.mark.parametrize("value", [1, 1.5, "^0\\.", True, {}, {"params": "^0\\."}, [1], [[{"params": "bias$"}]]])
def test_param_groups_that_are_no_list_of_mappings_are_config_errors(value):
    config = {"type": "SGD", "lr": 0.1, "param_groups": value}
    with pytest.raises(optcore.ConfigError, match=r"param_groups"):
        optcore.plan(config)
    with pytest.raises(optcore.ConfigError, match=r"param_groups"):
        optcore.build_optimizer(config, model())
    assert check_config(config)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_list_value_for_a_tuple_field_builds(name):
    """YAML's natural spelling of betas (``betas: [0.9, 0.95]``) inside a group."""
    spec = optcore.resolve(name)
    if "betas" not in spec.schema.model_fields:
        pytest.skip(f"{name} has no betas")
    config = {"type": name, "lr": 1e-3, "param_groups": [{"params": "^0\\.weight$", "betas": [0.9, 0.95]}]}
    assert check_config(config) == []
    opt = optcore.build_optimizer(config, model())
    betas = [g["betas"] for g in opt.param_groups if len(g["params"]) == 1 and g["params"][0].dim() == 2]
    assert [tuple(b) for b in betas] == [(0.9, 0.95)]


def test_a_dict_under_optimizer_builds_a_composite():
    """A per-group ``optimizer`` is a composite's part (docs/composite.md): its
    group is stepped by that optimizer, the rest by the config's own."""
    config = {"type": "AdamW", "param_groups": [{"params": "^0\\.weight$", "optimizer": {"type": "SGD", "lr": 0.1}}]}
    assert optcore.plan(config).parts
    assert check_config(config) == []
    opt = optcore.build_optimizer(config, model())
    assert isinstance(opt, optcore.composite.CompositeOptimizer)
    by_optimizer = {g["optimizer"].rsplit("-", 1)[0]: g for g in opt.param_groups if g["params"]}
    weight = model()[0].weight
    assert [p.shape for p in by_optimizer["SGD"]["params"]] == [weight.shape] and by_optimizer["SGD"]["lr"] == 0.1


def test_a_dict_under_optimizer_that_cannot_be_built_is_the_composites_config_error():
    config = {"type": "AdamW", "param_groups": [{"params": "^0\\.weight$", "optimizer": {"lr": 0.1}}]}
    for fn in (lambda: optcore.plan(config), lambda: optcore.build_optimizer(config, model())):
        with pytest.raises(optcore.ConfigError, match="no 'type' key") as info:
            fn()
        assert info.value.problems == [("type", "missing")]


@pytest.mark.parametrize("field", ["lr", "betas", "weight_decay", "eps"])
@pytest.mark.parametrize("value", [{"type": "SGD", "lr": 0.1}, {}, {"0": 0.9}])
def test_a_dict_value_of_any_other_field_is_a_config_error_naming_the_field(field, value):
    config = {"type": "AdamW", "param_groups": [{"params": "^0\\.weight$", field: value}]}
    for fn in (lambda: optcore.plan(config), lambda: optcore.build_optimizer(config, model())):
        with pytest.raises(optcore.ConfigError, match=r"param_groups\[0\]") as info:
            fn()
        assert [f for f, _ in info.value.problems] == [field]
    assert check_config(config)


@pytest.mark.parametrize("bad", [["a"], 3, {"x": 1}, None, math.nan])
def test_a_group_name_that_is_no_string_is_a_config_error(bad):
    config = {"type": "SGD", "lr": 0.1, "param_groups": [{"params": "^0\\.weight$", "name": bad}]}
    for fn in (lambda: optcore.plan(config), lambda: optcore.build_optimizer(config, model())):
        with pytest.raises(optcore.ConfigError, match=r"param_groups\[0\]\.name"):
            fn()
