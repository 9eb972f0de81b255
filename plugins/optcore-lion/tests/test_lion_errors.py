"""Bad hyper-parameters and inputs Lion cannot use: clear errors, nothing half-updated."""

from __future__ import annotations

import pytest
import torch
from optcore import ConfigError, StepError
from optcore_lion import Lion, LionConfig


def _params():
    return [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lr": -1e-4}, "lr"),
        ({"betas": (1.0, 0.99)}, "betas"),
        ({"betas": (0.9, -0.1)}, "betas"),
        ({"betas": (0.9,)}, "betas"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"lr": "fast"}, "lr"),
        ({"foreach": True, "fused": True}, "fused"),
    ],
)
def test_lion_rejects_bad_hyperparameters_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError) as info:
        Lion(_params(), **kwargs)
    assert any(name.startswith(field) for name, _ in info.value.problems), info.value.problems
    assert field in str(info.value)


def test_lion_parses_config_strings_and_validates_group_overrides():
    opt = Lion(_params(), lr="3e-4", betas="(0.95, 0.98)")
    assert opt.defaults["lr"] == 3e-4 and opt.defaults["betas"] == (0.95, 0.98)
    with pytest.raises(ConfigError, match="weight_decay"):
        Lion([{"params": _params(), "weight_decay": -1}])
    with pytest.raises(ConfigError, match="lr"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "lr": -1})


def test_lion_schema_has_descriptions_and_paper_defaults():
    fields = LionConfig.model_fields
    assert set(fields) == {"lr", "betas", "weight_decay", "maximize", "foreach", "fused", "compiled"}
    assert all(f.description for f in fields.values())
    assert (fields["lr"].default, fields["betas"].default, fields["weight_decay"].default) == (1e-4, (0.9, 0.99), 0.0)


def test_lion_rejects_complex_parameters_up_front():
    with pytest.raises(ConfigError, match="view_as_real"):
        Lion([torch.randn(3, dtype=torch.complex64, requires_grad=True)])


def _two_groups_one_bad(bad_grad):
    good, bad = _params(), [torch.randn(5, 2, requires_grad=True)]
    opt = Lion([{"params": good}, {"params": bad}], lr=1e-2)
    for p in good:
        p.grad = torch.ones_like(p)
    bad[0].grad = bad_grad
    return opt, good + bad


def test_lion_step_with_a_sparse_grad_raises_before_updating_anything():
    opt, params = _two_groups_one_bad(torch.eye(5, 2).to_sparse())
    before = [p.detach().clone() for p in params]
    with pytest.raises(StepError, match="sparse"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert not opt.state  # no momentum was touched either


def test_lion_fused_true_needs_fp32_cpu_tensors():
    p = torch.randn(3, dtype=torch.float64, requires_grad=True)
    p.grad = torch.ones_like(p)
    opt = Lion([p], fused=True)
    before = p.detach().clone()
    with pytest.raises(StepError, match="fused=None"):
        opt.step()
    assert torch.equal(p, before)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf")])
def test_lion_step_rejects_a_scale_that_is_not_positive(scale):
    opt, _ = _two_groups_one_bad(torch.ones(5, 2))
    with pytest.raises(StepError, match="scale"):
        opt.step(scale=scale)


def test_lion_step_rejects_unknown_groups():
    opt, _ = _two_groups_one_bad(torch.ones(5, 2))
    with pytest.raises(StepError, match="group"):
        opt.step(groups=[7])
