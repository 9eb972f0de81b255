"""Junk configs: building answers with success or an OptcoreError, never
anything else, and a failed build changes nothing (parameters, the caller's
config, the optimizer a scheduler was built for).

Every kind of optimizer is fuzzed: torch's, third-party packages' (their own
validation is ``assert``, custom exception classes, ...), the plugins by their
qualified names; and the schedulers. Examples are cheap (a 3-parameter model,
no step), so thousands run in CI time.
"""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optcore

THIRD_PARTY = [
    ("lion_pytorch", ["Lion", "lion_pytorch:Lion"]),
    ("pytorch_optimizer", ["pytorch_optimizer:Prodigy", "pytorch_optimizer:Lamb", "pytorch_optimizer:AdaBelief"]),
    ("optimi", ["optimi:AdamW", "optimi:Lion", "optimi:StableAdamW"]),
    ("transformers", ["transformers.optimization:Adafactor"]),
]
PLUGINS = ["optcore-lion:Lion", "optcore-adafactor:Adafactor", "optcore-adascale:AdaScaleSGD"]
TORCH = ["AdamW", "SGD", "Adam", "RMSprop", "Adagrad", "NAdam", "adafactor", "torch:SGD"]
JUNK_NAMES = ["nope", "a.b:C", "", ":", "os.system", "optcore-lion:", "lion_pytorch:Nope"]
INSTALLED = [n for module, names in THIRD_PARTY if importlib.util.find_spec(module) for n in names]
NAMES = TORCH + INSTALLED + PLUGINS + JUNK_NAMES

KEYS = ["lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "foreach", "fused", "amsgrad", "param_groups",
        "optim_args", "precision", "type", "maximize", "dampening", "foo", "no_decay", "wd", "beta1", "d0",
        "clip_threshold", "relative_step", "scale_parameter", "warmup_init", "decay_rate", "use_triton",
        "decoupled_weight_decay", "kahan_sum", "num_gradients_to_accumulate", "scale", "smoothing", "growth_rate"]
SPECIAL = st.sampled_from([
    "(0.9, 0.99)", "1e-3", "true", "false", "inf", "nan", "1e999", "-1", "0", "__import__('os')", "[1,2]", "rank=3",
    "\x1b[31m", "x" * 300, 10**400, 2**63, -(2**63), 0.0, -0.0, 1e-300, 1e300, math.inf, math.nan,
])
scalars = (
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8) | SPECIAL
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.sampled_from([*KEYS, "params", "lr_scale", "optional", "name"]), inner, max_size=3),
    max_leaves=5,
)
# regex param groups, valid and not, so the group code is reached often
param_groups = st.lists(
    st.fixed_dictionaries(
        {"params": st.sampled_from(["^0\\.", "^1\\.", "bias$", "^head\\.", "(", "", ".*"]) | values},
        optional={"lr": values, "lr_scale": values, "weight_decay": values, "optional": values, "eps": values},
    ),
    max_size=2,
)
# near-valid configs: numbers at the edges (0, negative, tiny, huge) reach the constructors' own checks
edge_numbers = st.sampled_from([0, 0.0, -1, -1e-8, 1e-12, 0.5, 1, 1.5, 2, 10, 1e30, 10**6]) | st.floats(-3, 3)
NUMERIC_KEYS = ["lr", "eps", "weight_decay", "momentum", "dampening", "d0", "d_coef", "growth_rate", "clip_threshold",
                "decay_rate", "beta1", "beta3", "max_lr", "scale", "smoothing", "num_gradients_to_accumulate"]
near_valid = st.builds(
    lambda name, hp, betas, flags: {"type": name, **hp, **betas, **flags},
    st.sampled_from(TORCH + INSTALLED + PLUGINS),
    st.dictionaries(st.sampled_from(NUMERIC_KEYS), edge_numbers, max_size=3),
    st.dictionaries(st.just("betas"), st.tuples(edge_numbers, edge_numbers) | st.tuples(edge_numbers), max_size=1),
    st.dictionaries(st.sampled_from(["relative_step", "scale_parameter", "warmup_init", "nesterov", "amsgrad"]),
                    st.booleans(), max_size=2),
)
optimizer_configs = st.one_of(
    near_valid,
    st.sampled_from(NAMES),
    st.fixed_dictionaries(
        {"type": st.sampled_from(NAMES)},
        optional={**{k: values for k in KEYS if k not in ("type", "param_groups")}, "param_groups": param_groups},
    ),
    st.dictionaries(st.sampled_from([*KEYS, "optimizer"]), values, max_size=4),
    values,
)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.LayerNorm(1))


def _fingerprint(config):
    return repr(config)  # nan-safe, unlike ==


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(config=optimizer_configs)
def test_junk_optimizer_configs_fail_cleanly_and_change_nothing(config):
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    given_config = _fingerprint(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            opt = optcore.build_optimizer(config, model)
        except optcore.OptcoreError:
            pass
        else:
            assert isinstance(opt, torch.optim.Optimizer)
    assert _fingerprint(config) == given_config
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


SCHEDULERS = ["cosine", "linear", "constant", "constant_with_warmup", "cosine_with_restarts", "cosine_with_min_lr",
              "polynomial", "inverse_sqrt", "fixed", "step", "manual", "triangular", "reduce_lr_on_plateau",
              "warmup_stable_decay", "tri_stage", "OneCycleLR", "StepLR", "MultiStepLR", "CosineAnnealingLR",
              "CyclicLR", "ReduceLROnPlateau", "SequentialLR", "ChainedScheduler", "LambdaLR", "ExponentialLR",
              "PolynomialLR", "torch:LinearLR", "pass_through", "nope", "os.path:join"]
SCHED_KEYS = ["warmup_steps", "num_warmup_steps", "warmup_updates", "num_training_steps", "T_max", "total_steps",
              "max_lr", "base_lr", "step_size", "gamma", "milestones", "schedulers", "num_cycles", "lr_end", "power",
              "min_lr", "min_lr_rate", "epochs", "steps_per_epoch", "pct_start", "factor", "patience", "eta_min",
              "lr_lambda", "scheduler_specific_kwargs", "lr_scheduler_kwargs", "type", "foo", "last_epoch",
              "num_decay_steps", "mode", "lr", "total_iters"]
sched_values = st.recursive(
    scalars | st.integers(-5, 10_000) | st.sampled_from(SCHEDULERS),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(SCHED_KEYS), inner, max_size=3),
    max_leaves=5,
)
scheduler_configs = st.one_of(
    st.sampled_from(SCHEDULERS),
    st.fixed_dictionaries(
        {"type": st.sampled_from(SCHEDULERS)}, optional={k: sched_values for k in SCHED_KEYS if k != "type"}
    ),
    st.dictionaries(st.sampled_from([*SCHED_KEYS, "lr_scheduler"]), sched_values, max_size=4),
    sched_values,
)
_OPT: list = []  # [optimizer, its fresh group settings]


def _optimizer() -> torch.optim.Optimizer:
    """One optimizer for every example (building one costs more than the example), reset each time."""
    if not _OPT:  # two groups, one with an lr_scale, as a real build gives
        opt = optcore.build_optimizer(
            {"type": "SGD", "lr": 0.1, "weight_decay": 0.01, "param_groups": [{"params": "^0\\.", "lr_scale": 0.5}]},
            _model(),
        )
        _OPT.extend([opt, [dict(g) for g in opt.param_groups]])
    opt, fresh = _OPT
    for group, settings_ in zip(opt.param_groups, fresh):
        group.clear()
        group.update(settings_)
    return opt


def _groups(opt):
    return repr([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    config=scheduler_configs,
    total=st.none() | st.integers(-3, 10**6) | SPECIAL | st.booleans() | st.text(max_size=3),
)
def test_junk_scheduler_configs_fail_cleanly_and_change_nothing(config, total):
    opt = _optimizer()
    before = _groups(opt)
    given_config = _fingerprint(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            optcore.build_scheduler(config, opt, num_training_steps=total)
        except optcore.OptcoreError:
            assert _groups(opt) == before
    assert _fingerprint(config) == given_config


GOOD = {
    "transformers.optimization:Adafactor": {"relative_step": False, "scale_parameter": False},
    "optcore-adafactor:Adafactor": {"relative_step": False, "scale_parameter": False},
    "optcore-adascale:AdaScaleSGD": {"num_gradients_to_accumulate": 2},
}


@pytest.mark.parametrize("name", INSTALLED + PLUGINS)
def test_every_fuzzed_optimizer_builds_from_a_good_config(name):
    """The fuzz reaches each constructor: a valid config builds every name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optcore.build_optimizer({"type": name, "lr": 1e-3, **GOOD.get(name, {})}, _model())
    assert isinstance(opt, torch.optim.Optimizer)
