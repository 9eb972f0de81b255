"""The contract members on adapted torch optimizers."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optcore
from optcore.plugin import adapt, by_device_and_dtype, total_grad_norm


def _grads(model, scale=1.0):
    torch.manual_seed(1)
    model.zero_grad()
    (model(torch.randn(16, 4)).pow(2).mean() * scale).backward()


@pytest.mark.parametrize("config", [{"type": "AdamW"}, {"type": "AdamW", "fused": False},
                                    {"type": "SGD", "momentum": 0.9}, {"type": "RMSprop"}])
def test_step_with_scale_equals_dividing_grads(model, config):
    m2 = copy.deepcopy(model)
    a, b = optcore.build_optimizer(config, model), optcore.build_optimizer(config, m2)
    for _ in range(3):
        _grads(model, 1024.0)
        a.step(scale=1024.0)
        _grads(m2)
        b.step()
    for p, q in zip(model.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_capability_flags_are_facts(model):
    assert optcore.build_optimizer("AdamW", model).supports_step_with_scale
    assert not optcore.build_optimizer("RMSprop", model).supports_step_with_scale
    assert not optcore.build_optimizer("AdamW", model).supports_memory_efficient_fp16
    assert optcore.build_optimizer("SGD", model).supports_flat_params
    assert not optcore.build_optimizer("Adafactor", model).supports_flat_params
    assert not optcore.build_optimizer("LBFGS", list(model.parameters())).supports_groups


def test_grad_scaler_interoperates(model):
    opt = optcore.build_optimizer({"type": "AdamW", "lr": 1e-2}, model)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        opt.zero_grad()
        scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert scaler.get_scale() == 256.0


@pytest.mark.parametrize("unscaled_first", [False, True])
def test_step_with_scale_under_grad_scaler_on_a_fused_torch_class(model, unscaled_first):
    """GradScaler sets ``grad_scale`` (None after its ``unscale_``, as before
    clipping) and deletes it after the step: ``step(scale=)`` leaves it as it was."""
    opt = optcore.build_optimizer({"type": "SGD", "lr": 0.1}, model)
    assert opt.supports_step_with_scale  # torch's fused SGD: the scale goes to the kernel
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
    scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
    grads = [p.grad / 16.0 for p in model.parameters()]
    expected = [p.detach() - 0.1 * g / 2.0 for p, g in zip(model.parameters(), grads)]
    if unscaled_first:
        scaler.unscale_(opt)
    scaler.step(opt, scale=2.0)
    scaler.update()
    assert "grad_scale" not in vars(opt)
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)


def test_clip_grad_norm(model):
    opt = optcore.build_optimizer("SGD", model)
    _grads(model)
    true = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert torch.allclose(opt.clip_grad_norm(0), true)
    assert torch.allclose(opt.clip_grad_norm(true / 2), true)
    assert torch.allclose(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]), true / 2, rtol=1e-4)
    assert opt.clip_grad_norm(0, aggregate_norm_fn=lambda n: n * 0 + 3.0) == 3.0
    model[0].weight.grad[0, 0] = float("inf")
    assert not torch.isfinite(opt.clip_grad_norm(1.0))


def test_load_state_dict_with_overrides(model):
    opt = optcore.build_optimizer({"type": "AdamW", "lr": 1e-3}, model)
    _grads(model)
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    fresh = optcore.build_optimizer({"type": "AdamW", "lr": 1e-3}, model)
    fresh.load_state_dict(torch.load(buf, weights_only=True), optimizer_overrides={"lr": 5e-4, "betas": (0.8, 0.9)})
    assert fresh.get_lr() == 5e-4 and all(g["betas"] == (0.8, 0.9) for g in fresh.param_groups)
    assert fresh.optimizer_config["lr"] == 5e-4
    with pytest.raises(optcore.ConfigError, match="unknown"):
        fresh.load_state_dict(opt.state_dict(), optimizer_overrides={"lrr": 1})


def test_groups_selection(model):
    opt = optcore.build_optimizer({"type": "SGD", "lr": 0.1, "param_groups": [{"params": r"^3\.", "name": "head"}]}, model)
    before = [p.detach().clone() for p in model.parameters()]
    _grads(model)
    opt.step(groups=["head"])
    changed = [not torch.equal(a, p) for a, p in zip(before, model.parameters())]
    assert changed == [False, False, False, False, True, True]
    with pytest.raises(optcore.StepError, match="unknown group"):
        opt.step(groups=["nope"])
    with pytest.raises(optcore.StepError, match="index"):
        opt.step(groups=[7])
    for bad in (1.0, True, [None]):  # neither an index nor a name: a StepError, not a TypeError
        with pytest.raises(optcore.StepError, match="unknown group"):
            opt.step(groups=bad)
    opt.step(groups=(g for g in ["head", 0]))  # any iterable of names and indices


def test_adapted_optimizers_pickle_and_keep_hooks_single(model):
    opt = optcore.build_optimizer("Adam", model)
    calls = []
    opt.register_step_post_hook(lambda *a: calls.append(1))
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # hooks torch's own Adam.step as well
    _grads(model)
    opt.step()
    assert calls == [1], "step hooks must run once"
    clone = pickle.loads(pickle.dumps(optcore.build_optimizer("Adam", model)))
    assert type(clone).__name__ == "Adam" and hasattr(clone, "clip_grad_norm")


def test_average_params_is_a_noop_without_distributed(model):
    opt = optcore.build_optimizer("SGD", model)
    before = [p.detach().clone() for p in model.parameters()]
    opt.average_params()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("name", ["StepLR", "CosineAnnealingLR", "OneCycleLR", "LinearLR", "ExponentialLR"])
def test_torch_lr_schedulers_work_unchanged(model, name):
    opt = optcore.build_optimizer({"type": "AdamW", "lr": 1e-2}, model)
    kwargs = {"StepLR": {"step_size": 1}, "CosineAnnealingLR": {"T_max": 10}, "OneCycleLR": {"max_lr": 0.1, "total_steps": 10},
              "LinearLR": {}, "ExponentialLR": {"gamma": 0.9}}[name]
    sched = getattr(torch.optim.lr_scheduler, name)(opt, **kwargs)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            _grads(model)
            opt.step()
            sched.step()
    assert opt.get_lr() == pytest.approx(sched.get_last_lr()[0])


# ------------------------------------------------------------- float64 grads
@pytest.mark.parametrize("config", [{"type": "AdamW"}, {"type": "SGD", "momentum": 0.9}, {"type": "Adagrad"}])
def test_clip_grad_norm_of_float64_grads_is_float64(model, config):
    model = model.double()
    opt = optcore.build_optimizer(config, model)
    torch.manual_seed(1)
    model(torch.randn(16, 4, dtype=torch.float64)).pow(2).mean().backward()
    true = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    norm = opt.clip_grad_norm(0)
    assert norm.dtype == torch.float64
    torch.testing.assert_close(norm, true, rtol=1e-12, atol=0)
    assert torch.allclose(opt.clip_grad_norm(float(true) / 2), true)
    opt.step()


def test_total_grad_norm_mixes_dtypes_in_the_highest_precision():
    grads = [torch.full((3,), 1e3, dtype=torch.float16), torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.bfloat16)]
    norm = total_grad_norm(grads)
    assert norm.dtype == torch.float64
    assert norm.item() == pytest.approx((3 * 1e6 + 4) ** 0.5, rel=1e-6)
    assert total_grad_norm([torch.full((4,), 6e4, dtype=torch.float16)]).dtype == torch.float32  # no fp16 overflow


# ------------------------------------------------- read-only param_groups
READ_ONLY_GROUPS = ["Lookahead", "OrthoGrad", "PCGrad", "ScheduleFreeWrapper", "TRAC", "CPUOffloadOptimizer"]


def test_plain_step_does_not_assign_param_groups(model):
    """pytorch_optimizer's Magma exposes param_groups as a read-only property; a
    plain step reads it and never assigns it, so the step updates and does not
    raise afterwards."""
    pytest.importorskip("pytorch_optimizer")
    opt = optcore.build_optimizer({"type": "pytorch_optimizer:Magma"}, model)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        _grads(model)
        opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert opt.supports_groups is False
    moved = [p.detach().clone() for p in model.parameters()]
    _grads(model)
    with pytest.raises(optcore.StepError, match="groups"):
        opt.step(groups=[0])
    assert all(torch.equal(a, p) for a, p in zip(moved, model.parameters())), "a refused step changed params"


@pytest.mark.parametrize("name", READ_ONLY_GROUPS)
def test_classes_with_read_only_param_groups_refuse_group_selection(name):
    pytest.importorskip("pytorch_optimizer")
    import pytorch_optimizer

    cls = getattr(pytorch_optimizer, name, None)
    if cls is None:
        pytest.skip(f"pytorch_optimizer has no {name} here")
    from optcore._contract import param_groups_assignable

    assert not param_groups_assignable(cls), f"{name}.param_groups is expected to be a read-only property"
    adapted = adapt(cls, groups=True)  # even when told the groups are independent
    assert adapted.supports_groups is False


class _ReadOnlyGroups(torch.optim.Optimizer):
    """Exposes an inner optimizer's groups read-only, as Lookahead-style wrappers do."""

    supports_groups = True  # claims independence; the read-only property still rules it out

    def __init__(self, params, lr=0.1):
        self.inner = torch.optim.SGD(params, lr=lr)
        self.defaults, self.state = self.inner.defaults, self.inner.state
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    @property
    def param_groups(self):
        return self.inner.param_groups

    def step(self, closure=None):
        return self.inner.step(closure)


def test_groups_on_read_only_param_groups_is_a_clear_error():
    p = torch.zeros(3, requires_grad=True)
    opt = adapt(_ReadOnlyGroups)([p])
    assert opt.supports_groups is False
    p.grad = torch.ones(3)
    opt.step()  # the plain path works
    assert torch.equal(p.detach(), torch.full((3,), -0.1))
    with pytest.raises(optcore.StepError, match="read-only property"):
        opt.step(groups=[0])
    assert torch.equal(p.detach(), torch.full((3,), -0.1))


def test_a_groups_declaration_holds_after_the_class_was_adapted():
    class Independent(torch.optim.Optimizer):  # a third-party class: no flags of its own
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.add_(p.grad, alpha=-group["lr"])

    first = adapt(Independent)
    assert first.supports_groups is False  # undeclared: optcore cannot vouch
    assert adapt(Independent, groups=True) is first and first.supports_groups is True
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    opt = first([{"params": [a]}, {"params": [b]}])
    a.grad, b.grad = torch.ones(2), torch.ones(2)
    opt.step(groups=[1])
    assert torch.equal(a.detach(), torch.zeros(2)) and torch.equal(b.detach(), torch.full((2,), -0.1))
    assert adapt(Independent, groups=False).supports_groups is False
    assert adapt(first, groups=True) is first and first.supports_groups is True  # the adapted class too


# ----------------------------------------------------------- tensor lr
def test_a_tensor_lr_stays_a_tensor_end_to_end(model):
    lr = torch.tensor(1e-2)
    opt = optcore.build_optimizer(
        {"type": "AdamW", "lr": lr, "param_groups": [{"params": r"^3\.", "name": "head", "lr_scale": 0.5}]}, model
    )
    lrs = [g["lr"] for g in opt.param_groups]
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in lrs)
    assert len({id(v) for v in lrs}) == len(lrs), "each group must own its lr tensor (schedulers fill them in place)"
    assert lrs[0] is not lr, "the user's tensor is copied, not shared with the optimizer"
    head = next(g for g in opt.param_groups if g.get("name") == "head")
    assert head["lr"].item() == pytest.approx(5e-3)
    assert isinstance(opt.get_lr(), torch.Tensor) and opt.get_lr().item() == pytest.approx(1e-2)
    assert isinstance(opt.optimizer_config["lr"], torch.Tensor)
    assert all(isinstance(v, torch.Tensor) for v in opt.get_lrs())
    opt.set_lr(torch.tensor(2e-2))
    assert [g["lr"] for g in opt.param_groups] == lrs or all(a is b for a, b in zip((g["lr"] for g in opt.param_groups), lrs))
    assert head["lr"].item() == pytest.approx(1e-2) and opt.get_lr().item() == pytest.approx(2e-2)
    opt.set_lr(4e-2)
    assert all(a is b for a, b in zip((g["lr"] for g in opt.param_groups), lrs)), "set_lr replaced a tensor lr"
    _grads(model)
    opt.step()
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    _grads(model)
    opt.step()
    sched.step()
    assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)
    fresh = optcore.build_optimizer(
        {"type": "AdamW", "lr": torch.tensor(1e-3), "param_groups": [{"params": r"^3\.", "name": "head", "lr_scale": 0.5}]},
        model,
    )
    fresh.load_state_dict(opt.state_dict(), optimizer_overrides={"lr": 3e-3})
    assert isinstance(fresh.param_groups[0]["lr"], torch.Tensor) and fresh.get_lr().item() == pytest.approx(3e-3)


@pytest.mark.parametrize("bad", [torch.tensor([1e-3]), torch.tensor(1), torch.tensor(-1e-3)])
def test_a_bad_tensor_lr_is_a_config_error(model, bad):
    with pytest.raises(optcore.ConfigError, match="lr"):
        optcore.build_optimizer({"type": "AdamW", "lr": bad}, model)


def test_capturable_is_passed_through(model):
    """torch steps capturable optimizers on accelerators only; optcore passes the
    flag through (and does not pick the fused kernel over it)."""
    opt = optcore.build_optimizer({"type": "Adam", "capturable": True, "lr": torch.tensor(1e-2)}, model)
    assert all(g["capturable"] and not g["fused"] for g in opt.param_groups)
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)


# ------------------------------------------------------ capabilities, once
@pytest.mark.parametrize("name", ["AdamW", "SGD", "RMSprop", "Adafactor", "LBFGS", "pytorch_optimizer:Magma", "optcore-lion:Lion"])
def test_spec_capabilities_are_the_built_optimizers_flags(model, name):
    """One computation (optcore._adapt.capabilities) behind both the spec's
    record and the adapted class: they cannot disagree."""
    spec = optcore.resolve(name)
    try:
        spec.target
    except optcore.PluginLoadError:
        pytest.skip(f"{name} does not import here")
    params = list(model.parameters()) if name == "LBFGS" else model
    opt = optcore.build_optimizer({"type": name}, params)
    assert spec.capabilities.as_dict() == {flag: getattr(opt, flag) for flag in spec.capabilities.as_dict()}


def test_adapting_keeps_a_class_s_own_lr_schedule_declaration():
    """The contract's default (``"any"``) comes first in the adapted class's MRO; a
    declaration of the class, attribute or property, still wins over it."""
    declared = type("DeclaredConstant", (torch.optim.SGD,), {"lr_schedule": "constant"})
    judged = type("JudgedPerGroup", (torch.optim.SGD,), {
        "lr_schedule": property(lambda self: "none" if self.param_groups[0].get("own_step") else "any")})
    p = torch.nn.Parameter(torch.zeros(1))
    assert adapt(declared)([p], lr=0.1).lr_schedule == "constant"
    opt = adapt(judged)([p], lr=0.1)
    assert opt.lr_schedule == "any"
    opt.param_groups[0]["own_step"] = True
    assert opt.lr_schedule == "none"
    assert adapt(torch.optim.SGD)([p], lr=0.1).lr_schedule == "any"


_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("cpu", "meta")), st.sampled_from(_DTYPES),
                          st.lists(st.integers(0, 3), max_size=3)), max_size=12), st.integers(1, 4))
def test_by_device_and_dtype_groups_aligned_lists_by_the_first(rows, n_lists):
    """Every (device, dtype) of the first list is one key, in order of first sight;
    each key holds the same tensor objects in their order, the other lists' entries
    aligned with them whatever their own dtype (fp32 state of fp16 params), and one
    list alone gives the plain lists of the several-lists form's first entries."""
    first = [torch.empty(shape, device=device, dtype=dtype) for device, dtype, shape in rows]
    others = [[t.to(torch.float32) if t.is_floating_point() else t.clone() for t in first] for _ in range(n_lists - 1)]
    lists = [first, *others]
    grouped = by_device_and_dtype(*lists) if n_lists > 1 else {k: (v,) for k, v in by_device_and_dtype(first).items()}
    keys = list(dict.fromkeys((t.device, t.dtype) for t in first))
    assert list(grouped) == keys
    for key, buckets in grouped.items():
        index = [i for i, t in enumerate(first) if (t.device, t.dtype) == key]
        assert len(buckets) == n_lists
        for bucket, source in zip(buckets, lists):
            assert len(bucket) == len(index) and all(a is source[i] for a, i in zip(bucket, index))
    assert {k: v[0] for k, v in grouped.items()} == by_device_and_dtype(first)


def test_by_device_and_dtype_refuses_lists_that_cannot_be_aligned():
    p = [torch.zeros(2), torch.zeros(3)]
    with pytest.raises(ValueError, match=r"lengths \[2, 1\]"):
        by_device_and_dtype(p, p[:1])
    with pytest.raises(TypeError, match="at least one list"):
        by_device_and_dtype()
    assert by_device_and_dtype([], []) == {} and by_device_and_dtype([]) == {}
