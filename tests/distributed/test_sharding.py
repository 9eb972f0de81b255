"""The ``sharding`` capability: how each optimizer's update couples elements.

Declared by plugins, known for torch's classes and the third-party classes in
optcore's table, ``"unknown"`` otherwise; the spec and the built optimizer say
the same, and ``optcore list --all`` / ``optcore show`` print it.
"""

from __future__ import annotations

import importlib
import json
import warnings

import pytest
import torch

import optcore
from optcore._torch_facts import PACKAGE_SHARDING, SHARDING_KINDS, TORCH_FACTS
from optcore.cli import main
from optcore.plugin import adapt

EXPECTED = {
    "torch:AdamW": "elementwise",
    "torch:SGD": "elementwise",
    "torch:Adafactor": "factored",
    "torch:Muon": "per_tensor",
    "torch:LBFGS": "global",
    "optcore-lion:Lion": "elementwise",
    "optcore-adafactor:Adafactor": "factored",
    "optcore-adascale:AdaScaleSGD": "global",
    "lion_pytorch:Lion": "elementwise",
    "pytorch_optimizer:Lamb": "per_tensor",
    "pytorch_optimizer:Prodigy": "global",
    "pytorch_optimizer:Magma": "unknown",  # not in optcore's table
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _spec(name: str) -> optcore.OptimizerSpec:
    try:
        spec = optcore.resolve(name)
        spec.target
    except (optcore.OptimizerNotFoundError, optcore.PluginLoadError) as exc:
        pytest.skip(f"{name} is not available here: {exc}")
    return spec


@pytest.mark.parametrize("name,kind", EXPECTED.items())
def test_the_spec_and_the_built_optimizer_say_the_same_sharding(name: str, kind: str) -> None:
    spec = _spec(name)
    assert spec.capabilities.sharding == kind
    assert spec.capabilities.as_dict()["sharding"] == kind
    model = _model()
    params = {"LBFGS": list(model.parameters()), "Muon": [p for p in model.parameters() if p.ndim == 2]}
    extra = {"Muon": {"lr": 0.02}, "AdaScaleSGD": {"num_gradients_to_accumulate": 2}}
    short = name.partition(":")[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optcore.build_optimizer({"type": name, **extra.get(short, {})}, params.get(short, model))
    assert opt.sharding == kind


def test_every_torch_class_has_a_known_kind() -> None:
    for name, (pointwise, _, kind) in TORCH_FACTS.items():
        assert kind in SHARDING_KINDS[:-1], name
        assert not pointwise or kind == "elementwise", f"{name}: a pointwise update is elementwise"


def test_every_third_party_entry_names_a_class_of_its_package() -> None:
    """A misspelt entry in the table would silently leave a class 'unknown'."""
    checked = 0
    for key, kind in PACKAGE_SHARDING.items():
        assert kind in SHARDING_KINDS[:-1], key
        top, _, name = key.partition(":")
        module = {"timm": "timm.optim", "transformers": "transformers.optimization"}.get(top, top)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue  # the package is not installed here
        assert isinstance(cls, type), f"{key}: {module} has no class {name}"
        assert adapt(cls).sharding == kind, key
        checked += 1
    assert checked >= 10, "too few of the table's packages are installed to check it"


def test_a_class_declaration_wins_and_a_bad_value_is_unknown() -> None:
    class Declared(torch.optim.SGD):
        sharding = "per_tensor"

    class Misspelt(torch.optim.SGD):
        sharding = "elementwize"

    class Plain(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

    assert adapt(Declared).sharding == "per_tensor"
    assert optcore._adapt.capabilities(Declared)["sharding"] == "per_tensor"
    assert optcore._adapt.capabilities(Misspelt)["sharding"] == "unknown"
    assert adapt(Plain).sharding == "unknown"


@pytest.mark.parametrize("inner,kind", [("optcore-lion:Lion", "elementwise"), ("optcore-adafactor:Adafactor", "factored")])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_a_precision_wrapper_has_its_inner_optimizers_sharding(inner: str, kind: str, memory_efficient: bool) -> None:
    _spec(inner)
    _spec("optcore-fp16:FP16Optimizer")
    model = _model().half()
    config = {"type": inner, "precision": "fp16", "memory_efficient": memory_efficient}
    opt = optcore.build_optimizer(config, model)
    assert opt.sharding == kind


def test_list_all_and_show_print_the_sharding(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json", "--all"]) == 0
    rows = {r["qualified"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["torch:Muon"]["capabilities"]["sharding"] == "per_tensor"
    assert rows["torch:AdamW"]["capabilities"]["sharding"] == "elementwise"
    assert main(["list", "--all"]) == 0
    table = capsys.readouterr().out
    assert "sharding" in table.splitlines()[1]
    assert any(line.startswith("Muon") and line.rstrip().endswith("per_tensor") for line in table.splitlines())
    assert main(["show", "torch:Adafactor"]) == 0
    assert "sharding=factored" in capsys.readouterr().out
    assert main(["show", "torch:Adafactor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capabilities"]["sharding"] == "factored"


def _fused_on_shards_worker(rank: int, world: int, configs: list[dict]) -> list[str | None]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out: list[str | None] = []
    for config in configs:
        model = _model()
        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
        try:
            optcore.build_optimizer(config, model)
        except optcore.ConfigError as exc:
            out.append(str(exc))
        else:
            out.append(None)
    return out


@pytest.mark.distributed
def test_fused_true_over_fsdp2_shards_is_refused_for_the_real_reason() -> None:
    """torch's fused SGD would fail in its first step (no sharding rule for
    aten._fused_sgd_), Lion's C kernel for a reason that is not the real one."""
    from _dist_util import run_ranks

    configs = [{"type": "SGD", "lr": 0.1, "fused": True}, {"type": "SGD", "lr": 0.1}]
    lion = "optcore-lion:Lion" in {s.qualified for s in optcore.list_optimizers()}
    if lion:
        configs += [{"type": "optcore-lion:Lion", "fused": True}, {"type": "optcore-lion:Lion"}]
    results = run_ranks(_fused_on_shards_worker, 1, configs)[0]
    for config, error in zip(configs, results):
        if config.get("fused"):
            assert error is not None and "fused=True" in error and "DTensor" in error, (config, error)
            assert "Leave fused unset" in error
        else:
            assert error is None, (config, error)  # unset: the foreach path over the shards


def _flatten_groups(opt: torch.optim.Optimizer) -> None:
    """What DeepSpeed ZeRO-1/2 does to a client optimizer: one flat fp32 partition per group."""
    for group in opt.param_groups:
        group["params"] = [torch.cat([p.detach().reshape(-1) for p in group["params"]]).requires_grad_()]
        group["params"][0].grad = torch.ones_like(group["params"][0])


@pytest.mark.parametrize(
    "name,refused",
    [("optcore-adafactor:Adafactor", True), ("torch:Adafactor", True), ("torch:AdamW", False), ("optcore-lion:Lion", False)],
)
def test_a_non_elementwise_optimizer_refuses_flat_partitions_at_its_first_step(name: str, refused: bool) -> None:
    _spec(name)
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optcore.build_optimizer({"type": name}, model)
    _flatten_groups(opt)
    before = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    if not refused:
        opt.step()
        return
    with pytest.raises(optcore.ConfigError, match=r"flat 1-D partition.*sharding='factored'"):
        opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, (p for g in opt.param_groups for p in g["params"])))


def test_same_shape_replacements_and_added_groups_pass() -> None:
    _spec("optcore-adafactor:Adafactor")
    model = _model()
    opt = optcore.build_optimizer({"type": "optcore-adafactor:Adafactor"}, model)
    for group in opt.param_groups:  # per-tensor fp32 copies, as FP16Optimizer(flat=False) makes
        group["params"] = [p.detach().clone().requires_grad_() for p in group["params"]]
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    extra = torch.zeros(3, 3, requires_grad=True)
    extra.grad = torch.ones(3, 3)
    opt.add_param_group({"params": [extra]})
    opt.step()
