"""The ``sharding`` capability: how each optimizer's update couples elements.

Declared by plugins, known for torch's classes and the third-party classes in
optcore's table, ``"unknown"`` otherwise; the spec and the built optimizer say
the same, and ``optcore list --all`` / ``optcore show`` print it.

Under FSDP2 the plan reads it with ``fused_steps_local_shards``: torch's fused
kernels are refused on DTensor parameters, optcore-lion's C kernel steps each
rank's local shards; one spawned 2-rank group (a module fixture) runs those
cases against one process on the full batch, and saves the DCP checkpoint
that one process resumes.
"""

from __future__ import annotations

import importlib
import json
import warnings
from dataclasses import replace
from typing import Any

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


def test_list_all_and_show_print_the_sharding(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # each row on one line, as piped
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


LION = {"type": "optcore-lion:Lion", "lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.1}
#: Lion's C kernel on FSDP2's local shards, against one process: fused=True, and unset (the kernel too)
KERNEL_CASES = {"fused": {**LION, "fused": True}, "default": LION}
STEPS, SAVED_AT, HALF = 5, 3, 4


class _Uneven(torch.nn.Module):
    """Dim 0 sizes 5 (split 3/2 over 2 ranks) and 1 (rank 1's shard empty)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 5), torch.nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def _uneven(world: int | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    model = _Uneven()
    if world is not None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model.a, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def _train_lion(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int | None = None) -> None:
    """The full batch, or ``rank``'s half of it."""
    for step in steps:
        g = torch.Generator().manual_seed(100 + step)
        x, y = torch.randn(2 * HALF, 6, generator=g), torch.randn(2 * HALF, 1, generator=g)
        rows = slice(None) if rank is None else slice(rank * HALF, (rank + 1) * HALF)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()


def _whole(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters and momenta, each whole (a DTensor gathered)."""
    tensors = [*model.parameters(), *(opt.state[p]["exp_avg"] for p in model.parameters())]
    return [(t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone() for t in tensors]


def _assert_as_one_process(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    """Parameters bitwise (each moves by lr * sign, the same signs), momenta to 1e-7
    (FSDP2 averages two half-batch gradients: 1.9e-9 measured)."""
    n = len(want) // 2
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        close = torch.equal(a, b) if i < n else torch.allclose(a, b, rtol=0.0, atol=1e-7)
        kind = "parameter" if i < n else "momentum"
        assert close, f"{what}: {kind} {i % n} off by {(a - b).abs().max():.3g}"


def _one_process_lion() -> dict[str, list[torch.Tensor]]:
    out = {}
    for name, config in KERNEL_CASES.items():
        model = _uneven()
        opt = optcore.build_optimizer(config, model)
        _train_lion(model, opt, range(STEPS))
        out[name] = _whole(model, opt)
    return out


def _recording_kernel(record: list[list[tuple[str, tuple[int, ...]]]]) -> Any:
    """Wraps the Lion kernel's launch so each call records the (type, shape) of
    the parameters it steps; returns what undoes it."""
    from optcore_lion import _cpu_kernel

    run = _cpu_kernel.Batch.run

    def recording(batch: Any, **kwargs: Any) -> None:
        if len(batch):
            record.append([(type(p).__name__, tuple(p.shape)) for p in batch.params])
        run(batch, **kwargs)

    _cpu_kernel.Batch.run = recording
    return lambda: setattr(_cpu_kernel.Batch, "run", run)


def _other_placement(rank: int, world: int) -> dict[str, Any]:
    """A parameter placed Shard(1): fused=True is a StepError naming the
    placement; unset, torch ops step it (compared with the same step on the whole tensor)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    whole, grad = torch.randn(3, 4), torch.randn(3, 4)
    out: dict[str, Any] = {}
    for name, config in KERNEL_CASES.items():
        p = torch.nn.Parameter(distribute_tensor(whole.clone(), mesh, [Shard(1)]))
        p.grad = distribute_tensor(grad.clone(), mesh, [Shard(1)])
        opt = optcore.build_optimizer(config, [p])
        try:
            opt.step()
        except optcore.StepError as exc:
            out[name] = str(exc)
        else:
            out[name] = p.full_tensor().detach().clone()
    reference = torch.nn.Parameter(whole.clone())
    reference.grad = grad.clone()
    opt = optcore.build_optimizer({**LION, "fused": False}, [reference])
    opt.step()
    out["reference"] = reference.detach().clone()
    return out


def _on_fsdp2_ranks(rank: int, world: int, refusals: list[dict[str, Any]], root: str) -> dict[str, Any]:
    """Builds under FSDP2 (the refusals), Lion's kernel over 2 ranks' uneven
    and empty shards, a DCP save of the fused run after ``SAVED_AT`` steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out: dict[str, Any] = {"refusals": []}
    for config in refusals:
        model = _model()
        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
        try:
            optcore.build_optimizer(config, model)
        except optcore.ConfigError as exc:
            out["refusals"].append(str(exc))
        else:
            out["refusals"].append(None)
    for name, config in KERNEL_CASES.items():
        record: list[list[tuple[str, tuple[int, ...]]]] = []
        undo = _recording_kernel(record)
        try:
            model = _uneven(world)
            opt = optcore.build_optimizer(config, model)
            _train_lion(model, opt, range(SAVED_AT), rank)
        finally:
            undo()
        if name == "fused":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
                dcp.save(state, checkpoint_id=root)
        _train_lion(model, opt, range(SAVED_AT, STEPS), rank)
        out[name] = {"calls": record, "whole": _whole(model, opt),
                     "state": sorted({type(v).__name__ for s in opt.state.values() for v in s.values()})}
    out["other_placement"] = _other_placement(rank, world)
    return out


REFUSALS = [{"type": "SGD", "lr": 0.1, "fused": True}, {"type": "AdamW", "lr": 0.1, "fused": True},
            {"type": "SGD", "lr": 0.1}, {"type": "optcore-lion:Lion", "fused": True}]


@pytest.fixture(scope="module")
def fsdp2_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One spawned 2-rank group for the module's FSDP2 cases; the one-process
    reference is computed while the ranks start."""
    from _dist_util import run_ranks

    _spec("optcore-lion:Lion")
    root = tmp_path_factory.mktemp("lion-dcp")
    reference: dict[str, Any] = {}
    ranks = run_ranks(_on_fsdp2_ranks, 2, REFUSALS, str(root), timeout=180,
                      meanwhile=lambda: reference.update(_one_process_lion()))
    return {"ranks": ranks, "reference": reference, "root": root}


@pytest.mark.distributed
def test_torchs_fused_true_over_fsdp2_shards_is_refused_for_the_real_reason(fsdp2_ranks: dict[str, Any]) -> None:
    """torch's fused SGD and AdamW would fail in their first step (no sharding
    rule for aten._fused_sgd_); Lion's kernel steps local shards and builds."""
    for rank in fsdp2_ranks["ranks"]:
        for config, error in zip(REFUSALS, rank["refusals"]):
            if config.get("fused") and config["type"] in ("SGD", "AdamW"):
                assert error is not None and "fused=True" in error and "DTensor" in error, (config, error)
                assert f"aten._fused_{config['type'].lower()}_" in error and "no sharding rule" in error, error
                assert "Leave fused unset" in error
            else:
                assert error is None, (config, error)  # SGD unset: the foreach path over the shards


def test_a_plugin_kernel_that_does_not_declare_local_shards_is_refused_naming_the_attribute() -> None:
    from optcore.placement import refuse_kernels_on_shards

    class Shard(torch.Tensor):  # stands in for a DTensor: the check reads placements and device_mesh
        placements, device_mesh = ("Shard(0)",), "mesh"

    spec = _spec("optcore-lion:Lion")
    groups = [{"params": [torch.zeros(2).as_subclass(Shard)], "fused": True}]
    refuse_kernels_on_shards(spec, {}, groups)  # Lion declares fused_steps_local_shards
    undeclared = type("Undeclared", (spec.target,), {"fused_steps_local_shards": False})
    with pytest.raises(optcore.ConfigError, match=r"fused_steps_local_shards = True.*Leave fused unset"):
        refuse_kernels_on_shards(replace(spec, loader=lambda: undeclared), {}, groups)


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_lions_kernel_steps_fsdp2_local_shards_as_one_process(fsdp2_ranks: dict[str, Any], case: str) -> None:
    """fused=True, and fused unset (the kernel is the CPU fp32 default in one
    process too): the kernel gets each rank's plain local shards, uneven
    (3/2 rows) and empty (rank 1's row of b), and parameters and momenta equal
    one process on the full batch."""
    want = fsdp2_ranks["reference"][case]
    for rank, info in enumerate(fsdp2_ranks["ranks"]):
        got = info[case]
        local = {0: [(3, 6), (3,), (1, 5), (1,)], 1: [(2, 6), (2,), (0, 5), (0,)]}[rank]
        seen = sorted(t for call in got["calls"] for t in call)  # every step, both param groups
        assert seen == sorted([("Tensor", shape) for shape in local] * SAVED_AT), got["calls"]
        assert got["state"] == ["DTensor"], "the momentum is a DTensor placed like its parameter (DCP reshards it)"
        _assert_as_one_process(got["whole"], want, f"{case} on rank {rank}")


@pytest.mark.distributed
def test_lion_fused_on_fsdp2_resumes_from_dcp_in_one_process(fsdp2_ranks: dict[str, Any]) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
    )

    torch.manual_seed(7)
    model = _Uneven()
    opt = optcore.build_optimizer(KERNEL_CASES["fused"], model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(fsdp2_ranks["root"]))
        set_model_state_dict(model, state["model"])
        state = {"optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=str(fsdp2_ranks["root"]))
        set_optimizer_state_dict(model, opt, state["optim"])
    assert all(g["fused"] is True for g in opt.param_groups)
    _train_lion(model, opt, range(SAVED_AT, STEPS))
    _assert_as_one_process(_whole(model, opt), fsdp2_ranks["reference"]["fused"], "resumed from 2 ranks")


@pytest.mark.distributed
def test_lion_on_another_placement_is_refused_by_name_with_fused_and_steps_by_torch_ops_unset(
    fsdp2_ranks: dict[str, Any],
) -> None:
    for info in fsdp2_ranks["ranks"]:
        other = info["other_placement"]
        assert isinstance(other["fused"], str) and "Shard(dim=1)" in other["fused"], other["fused"]
        assert "set fused=None" in other["fused"]
        assert torch.equal(other["default"], other["reference"])


def _flatten_groups(opt: torch.optim.Optimizer) -> None:
    """What DeepSpeed ZeRO does to a client optimizer (any stage): flat fp32 partitions of each group."""
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
    with pytest.raises(optcore.ConfigError, match=r"ZeRO stages 1, 2 and 3 .*flat 1-D partitions.*sharding=.factored."):
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
