"""Junk configs: build_optimizer answers with success or an OptcoreError, never
anything else, and a failed build leaves every parameter as it was."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optcore

NAMES = ["AdamW", "SGD", "Adam", "RMSprop", "Adagrad", "lion", "adafactor", "nope", "torch:SGD", "a.b:C", "", ":", "os.system"]
KEYS = ["lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "foreach", "fused", "amsgrad", "param_groups",
        "optim_args", "precision", "type", "maximize", "dampening", "foo", "no_decay"]
values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["(0.9, 0.99)", "1e-3", "true", "__import__('os')", "[1,2]", "rank=3"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS + ["params"]), inner, max_size=3),
    max_leaves=6,
)
configs = st.one_of(
    st.sampled_from(NAMES),
    st.fixed_dictionaries({"type": st.sampled_from(NAMES)}, optional={k: values for k in KEYS if k != "type"}),
    st.dictionaries(st.sampled_from(KEYS + ["optimizer"]), values, max_size=4),
    values,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs)
def test_junk_configs_fail_cleanly_and_change_nothing(config):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    before = [p.detach().clone() for p in model.parameters()]
    try:
        opt = optcore.build_optimizer(config, model)
    except optcore.OptcoreError:
        pass
    else:
        assert isinstance(opt, torch.optim.Optimizer)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
