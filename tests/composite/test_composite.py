"""Composite optimizers: one config, several algorithms (optcore.composite)."""

from __future__ import annotations

import copy
import json
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import optcore
from optcore import ConfigError

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch has no Muon")

MUON_ADAMW = {"type": "Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 3e-4}}


class Tiny(nn.Module):
    """Embedding, two hidden matrices with biases, a norm, an output head."""

    def __init__(self, vocab: int = 16, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.lm_head(self.norm(h + self.blocks(h)))


def tiny(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randint(0, 16, (4, 6), generator=g), torch.randint(0, 16, (4, 6), generator=g)


def loss_of(model: nn.Module, i: int) -> torch.Tensor:
    x, y = batch(i)
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def train(model: nn.Module, opt: Any, steps: range, scheduler: Any = None) -> None:
    for i in steps:
        opt.zero_grad()
        loss_of(model, i).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


# ------------------------------------------------------------------ routing
def test_fallback_routes_matrices_to_muon_and_the_rest_to_adamw() -> None:
    model = tiny()
    plan = optcore.plan(MUON_ADAMW, model)
    table = {row["name"]: (row["optimizer"], row["why"]) for row in plan.routing}
    assert table == {
        "blocks.0.weight": ("Muon", "2-D hidden matrix"),
        "blocks.2.weight": ("Muon", "2-D hidden matrix"),
        "embed.weight": ("AdamW", "embedding"),
        "lm_head.weight": ("AdamW", "output head"),
        "blocks.0.bias": ("AdamW", "1-D"),
        "blocks.2.bias": ("AdamW", "1-D"),
        "norm.weight": ("AdamW", "1-D"),
        "norm.bias": ("AdamW", "1-D"),
    }
    rows = {row["name"]: row for row in plan.routing}
    assert (rows["blocks.0.weight"]["lr"], rows["blocks.0.weight"]["weight_decay"]) == (0.02, 0.1)  # Muon's default wd
    assert (rows["embed.weight"]["lr"], rows["embed.weight"]["weight_decay"]) == (3e-4, 0.01)
    assert rows["norm.weight"]["weight_decay"] == 0.0  # the no-decay default holds inside a route


def test_the_optimizer_is_one_torch_optimizer_with_flat_labelled_groups() -> None:
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    assert isinstance(opt, torch.optim.Optimizer)
    assert {g["optimizer"] for g in opt.param_groups} == {"Muon", "AdamW"}
    for label, part in opt.parts.items():
        assert all(any(g is h for h in opt.param_groups) for g in part.param_groups)  # the same dicts
        assert {g["optimizer"] for g in part.param_groups} == {label}
    seen = [p for g in opt.param_groups for p in g["params"]]
    assert len(seen) == len({id(p) for p in seen}) == len(list(model.parameters()))


def test_per_group_optimizer_routes_by_regex() -> None:
    model = tiny()
    config = {"type": "AdamW", "lr": 1e-3, "param_groups": [{"params": r"^blocks\.\d+\.weight$", "optimizer": {"type": "Muon", "lr": 0.02}}]}
    plan = optcore.plan(config, model)
    muon = sorted(r["name"] for r in plan.routing if r["optimizer"] == "Muon")
    assert muon == ["blocks.0.weight", "blocks.2.weight"]
    assert {r["optimizer"] for r in plan.routing if r["name"] not in muon} == {"AdamW"}
    opt = optcore.build_optimizer(config, model)
    train(model, opt, range(2))


def test_group_overrides_apply_inside_a_route() -> None:
    config = {**MUON_ADAMW, "param_groups": [{"params": r"^lm_head\.", "lr_scale": 0.5}]}
    rows = {r["name"]: r for r in optcore.plan(config, tiny()).routing}
    assert rows["lm_head.weight"]["lr"] == pytest.approx(1.5e-4)
    assert rows["blocks.0.weight"]["lr"] == 0.02


def test_a_group_override_the_route_does_not_take_is_a_config_error() -> None:
    config = {**MUON_ADAMW, "param_groups": [{"params": r"^blocks\.0\.weight$", "amsgrad": True}]}
    with pytest.raises(ConfigError, match="amsgrad"):
        optcore.plan(config, tiny())


def test_a_parameter_claimed_where_it_cannot_go_is_listed() -> None:
    config = {"type": "AdamW", "param_groups": [{"params": r"^blocks\.0\.", "optimizer": {"type": "Muon"}}]}
    with pytest.raises(ConfigError, match=r"blocks\.0\.bias \(16,\) -> Muon") as exc:
        optcore.plan(config, tiny())
    assert "blocks.0.weight" not in str(exc.value)


def test_a_parameter_claimed_by_two_rules_is_listed() -> None:
    config = {**MUON_ADAMW, "param_groups": [
        {"params": r"^blocks\.0\.weight$", "optimizer": {"type": "SGD", "lr": 0.1}},
        {"params": r"^blocks\.0\.", "optimizer": {"type": "Adam"}},
    ]}
    with pytest.raises(ConfigError, match=r"blocks\.0\.weight.*more than one"):
        optcore.plan(config, tiny())


def test_muon_with_no_matrix_to_take_is_a_config_error() -> None:
    model = nn.Sequential(nn.Embedding(8, 4), nn.LayerNorm(4))
    with pytest.raises(ConfigError, match="Muon is routed no parameter"):
        optcore.plan(MUON_ADAMW, model)


def test_a_fallback_for_an_optimizer_that_takes_everything_is_refused() -> None:
    with pytest.raises(ConfigError, match="fallback would step none"):
        optcore.plan({"type": "AdamW", "fallback": {"type": "SGD", "lr": 0.1}}, tiny())


def test_a_fallback_config_is_checked_without_parameters() -> None:
    plan = optcore.plan(MUON_ADAMW)
    assert [p.spec.name for p in plan.parts] == ["Muon", "AdamW"]
    with pytest.raises(ConfigError, match="lrr"):
        optcore.plan({"type": "Muon", "fallback": {"type": "AdamW", "lrr": 1}})
    with pytest.raises(ConfigError, match="beside the main 'type'"):
        optcore.plan({"type": "Muon", "fallback": {"type": "AdamW", "fallback": {"type": "SGD"}}})
    with pytest.raises(ConfigError, match="optimizer config"):
        optcore.plan({"type": "Muon", "fallback": 3})


def test_parameters_given_by_name_are_routed_by_name() -> None:
    model = tiny()
    named = dict(model.named_parameters())
    table = {r["name"]: r["optimizer"] for r in optcore.plan(MUON_ADAMW, named).routing}
    assert table["embed.weight"] == table["lm_head.weight"] == "AdamW"
    assert table["blocks.0.weight"] == "Muon"


# ---------------------------------------------------------------- numerics
def _reference(model: Tiny) -> list[torch.optim.Optimizer]:
    """The same split, by hand, as two torch optimizers (optcore picks fused AdamW where it can)."""
    fused = optcore.plan("AdamW", model).hparams["fused"]
    muon = torch.optim.Muon([model.blocks[0].weight, model.blocks[2].weight], lr=0.02)
    adamw = torch.optim.AdamW(
        [
            {"params": [model.embed.weight, model.lm_head.weight]},
            {"params": [model.blocks[0].bias, model.blocks[2].bias, model.norm.weight, model.norm.bias], "weight_decay": 0.0},
        ],
        lr=3e-4, fused=fused,
    )
    return [muon, adamw]


class _Both:
    def __init__(self, opts: list[torch.optim.Optimizer]) -> None:
        self.opts = opts

    def zero_grad(self) -> None:
        for o in self.opts:
            o.zero_grad()

    def step(self) -> None:
        for o in self.opts:
            o.step()


def test_composite_equals_separate_torch_optimizers_bitwise() -> None:
    got, want = tiny(), tiny()
    train(got, optcore.build_optimizer(MUON_ADAMW, got), range(5))
    train(want, _Both(_reference(want)), range(5))
    for (name, a), b in zip(got.named_parameters(), want.parameters()):
        assert torch.equal(a, b), name


def test_one_scheduler_drives_every_group_from_its_own_base_lr() -> None:
    got, want = tiny(), tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, got)
    refs = _reference(want)
    rule = lambda step: 0.5 ** step  # noqa: E731
    train(got, opt, range(4), torch.optim.lr_scheduler.LambdaLR(opt, rule))
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, rule) for o in refs]

    class _Sched:
        def step(self) -> None:
            for s in scheds:
                s.step()

    train(want, _Both(refs), range(4), _Sched())
    for a, b in zip(got.parameters(), want.parameters()):
        assert torch.equal(a, b)
    lrs = {g["optimizer"]: g["lr"] for g in opt.param_groups}
    assert lrs == {"Muon": pytest.approx(0.02 / 16), "AdamW": pytest.approx(3e-4 / 16)}


def test_state_dict_resumes_exactly() -> None:
    straight = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, straight)
    train(straight, opt, range(6))

    first = tiny()
    opt1 = optcore.build_optimizer(MUON_ADAMW, first)
    train(first, opt1, range(3))
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt1.state_dict())
    assert set(saved_opt) == {"state", "param_groups", "optcore"}  # torch's layout
    assert [g["optimizer"] for g in saved_opt["param_groups"]] == [g["optimizer"] for g in opt1.param_groups]

    resumed = tiny(seed=1)
    resumed.load_state_dict(saved_model)
    opt2 = optcore.build_optimizer(MUON_ADAMW, resumed)
    opt2.load_state_dict(saved_opt)
    for label, part in opt2.parts.items():
        assert part.state is opt2.state and all(g["optimizer"] == label for g in part.param_groups)
    train(resumed, opt2, range(3, 6))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_state_dict_routed_differently_is_refused() -> None:
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    train(model, opt, range(1))
    other = optcore.build_optimizer({"type": "AdamW", "param_groups": [{"params": r"^blocks\.0\.weight$", "optimizer": {"type": "Muon"}}]}, model)
    with pytest.raises(ConfigError):
        other.load_state_dict(opt.state_dict())


def test_clip_grad_norm_is_global() -> None:
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    loss_of(model, 0).backward()
    want = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert torch.allclose(opt.clip_grad_norm(0.0), want)
    norm = opt.clip_grad_norm(0.5)
    assert torch.allclose(norm, want)
    assert torch.allclose(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]), torch.tensor(0.5), rtol=1e-4)


def test_step_with_scale_and_groups() -> None:
    a, b = tiny(), tiny()
    opt_a, opt_b = optcore.build_optimizer(MUON_ADAMW, a), optcore.build_optimizer(MUON_ADAMW, b)
    (2.0 * loss_of(a, 0)).backward()
    loss_of(b, 0).backward()
    opt_a.step(scale=2.0)
    opt_b.step()
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.allclose(x, y, atol=1e-7)

    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss_of(model, 0).backward()
    muon_groups = [i for i, g in enumerate(opt.param_groups) if g["optimizer"] == "Muon"]
    opt.step(groups=muon_groups)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"blocks.0.weight", "blocks.2.weight"}


def test_capability_flags_are_true_of_the_whole() -> None:
    opt = optcore.build_optimizer(MUON_ADAMW, tiny())
    assert opt.supports_flat_params is False
    assert opt.supports_groups is all(p.supports_groups for p in opt.parts.values())
    assert opt.supports_step_with_scale is False  # Muon has no fused kernel that takes the scale
    assert opt.supports_memory_efficient_fp16 is False
    assert set(opt.optimizer_config) == {"Muon", "AdamW"}


def test_set_lr_keeps_each_group_at_its_ratio() -> None:
    opt = optcore.build_optimizer(MUON_ADAMW, tiny())
    assert opt.get_lr() == pytest.approx(0.02)
    opt.set_lr(0.01)
    lrs = {g["optimizer"]: g["lr"] for g in opt.param_groups}
    assert lrs == {"Muon": pytest.approx(0.01), "AdamW": pytest.approx(1.5e-4)}
    opt.set_lr(opt.get_lr())
    assert {g["optimizer"]: g["lr"] for g in opt.param_groups} == lrs


def test_a_part_with_a_relative_step_size_keeps_it_under_set_lr() -> None:
    """Adafactor's relative step has lr None: the composite builds, steps, and
    set_lr moves Muon's lr while Adafactor keeps computing its own."""
    pytest.importorskip("optcore_adafactor")
    model = tiny()
    opt = optcore.build_optimizer({"type": "Muon", "lr": 0.02, "fallback": {"type": "optcore-adafactor:Adafactor"}},
                                  model)
    before = [p.detach().clone() for p in model.parameters()]
    loss_of(model, 0).backward()
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    opt.set_lr(0.01)
    lrs = {g["optimizer"]: g["lr"] for g in opt.param_groups}
    assert lrs == {"Muon": pytest.approx(0.01), "Adafactor": None}


# ------------------------------------------------------ the first-step check
def test_first_step_names_parameters_a_frozen_module_left_unstepped() -> None:
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    model.blocks[0].weight.requires_grad_(False)
    loss_of(model, 0).backward()
    with pytest.warns(UserWarning, match=r"blocks\.0\.weight \(16, 8\) -> Muon"):
        opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()  # once


def test_first_step_refuses_a_part_whose_groups_changed() -> None:
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    stray = nn.Parameter(torch.randn(4, 4))
    opt.parts["Muon"].param_groups[0]["params"].append(stray)
    loss_of(model, 0).backward()
    stray.grad = torch.randn(4, 4)
    with pytest.raises(ConfigError, match="not routed to it"):
        opt.step()


# ------------------------------------------------------------ Muon's lr rules
def test_match_rms_adamw_lets_one_lr_serve_both_halves() -> None:
    config = {"type": "Muon", "lr": 1e-3, "adjust_lr_fn": "match_rms_adamw", "fallback": "AdamW"}
    lrs = {r["optimizer"]: r["lr"] for r in optcore.plan(config, tiny()).routing}
    assert lrs == {"Muon": 1e-3, "AdamW": 1e-3}
    explicit = {**config, "fallback": {"type": "AdamW", "lr": 5e-4}}
    assert {r["optimizer"]: r["lr"] for r in optcore.plan(explicit, tiny()).routing}["AdamW"] == 5e-4
    original = {**config, "adjust_lr_fn": "original"}  # another scale: AdamW keeps its own default
    assert {r["optimizer"]: r["lr"] for r in optcore.plan(original, tiny()).routing}["AdamW"] == 1e-3 == torch.optim.AdamW([torch.zeros(1)]).defaults["lr"]
    with pytest.raises(ConfigError, match="'original' or 'match_rms_adamw'"):
        optcore.plan({**config, "adjust_lr_fn": "match_rms_adam"})


def test_match_rms_adamw_steps_as_torch_muon_with_that_rule() -> None:
    got, want = tiny(), tiny()
    config = {"type": "Muon", "lr": 1e-3, "adjust_lr_fn": "match_rms_adamw", "fallback": "AdamW"}
    train(got, optcore.build_optimizer(config, got), range(3))
    refs = _reference(want)
    refs[0] = torch.optim.Muon([want.blocks[0].weight, want.blocks[2].weight], lr=1e-3, adjust_lr_fn="match_rms_adamw")
    for g in refs[1].param_groups:
        g["lr"] = 1e-3
    train(want, _Both(refs), range(3))
    for a, b in zip(got.parameters(), want.parameters()):
        assert torch.equal(a, b)


def test_the_compare_line_up_has_muon_with_adamw() -> None:
    from optcore.compare import lineup

    entries = {e["name"]: e["optimizer"] for e in lineup.default_entries()}
    assert entries["Muon+AdamW"]["fallback"]["type"] == "torch:AdamW"
    model = tiny()
    opt = optcore.build_optimizer(entries["Muon+AdamW"], model)
    assert {g["optimizer"] for g in opt.param_groups} == {"Muon", "AdamW"}


# ----------------------------------------------------------------- the CLI
def test_optcore_show_prints_the_routing_table(tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    from optcore.cli import main

    (tmp_path / "routed_model.py").write_text(
        "from test_composite import Tiny\n\ndef build():\n    return Tiny()\n"
    )
    (tmp_path / "run.yaml").write_text("type: Muon\nlr: 0.02\nfallback:\n  type: AdamW\n  lr: 3.0e-4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["show", "--config", str(tmp_path / "run.yaml"), "--model", "routed_model:build", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["blocks.0.weight"]["optimizer"] == "Muon" and rows["blocks.0.weight"]["lr"] == 0.02
    assert rows["lm_head.weight"]["optimizer"] == "AdamW" and rows["norm.bias"]["weight_decay"] == 0.0
    assert main(["show", "--config", str(tmp_path / "run.yaml"), "--model", "routed_model:build"]) == 0
    text = capsys.readouterr().out
    assert "embed.weight" in text and "output head" in text
    assert main(["show", "--config", str(tmp_path / "run.yaml")]) == 0
    assert "and torch:AdamW (lr=0.0003)" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "run.yaml")]) == 0


def test_sharding_and_lr_schedule_are_those_of_the_whole() -> None:
    opt = optcore.build_optimizer(MUON_ADAMW, tiny())
    assert opt.parts["Muon"].sharding == "per_tensor" and opt.parts["AdamW"].sharding == "elementwise"
    assert opt.sharding == "per_tensor"
    assert opt.lr_schedule == "any"


# -------------------------------------------------------------- optcore memory
def _state_bytes(opt: Any, label: str) -> int:
    part = opt.parts[label]
    return sum(t.numel() * t.element_size() for g in part.param_groups for p in g["params"]
               for t in opt.state.get(p, {}).values() if isinstance(t, torch.Tensor))


def test_memory_predicts_each_route_as_a_real_step_holds_it() -> None:
    from optcore.compare.memory import predict

    row = predict(MUON_ADAMW, Tiny)
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    train(model, opt, range(1))
    measured = {label: _state_bytes(opt, label) for label in opt.parts}
    assert row["state_by_optimizer"] == measured
    matrices = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks") and n.endswith("weight"))
    assert measured["Muon"] == 4 * matrices  # one momentum buffer
    assert measured["AdamW"] == 2 * 4 * (sum(p.numel() for p in model.parameters()) - matrices) + 4 * 6  # two moments, a step each
    assert row["state_bytes"] == sum(measured.values())


def test_memory_with_step_in_backward_holds_no_gradient_buffer() -> None:
    from optcore.compare.memory import predict

    plain, in_backward = predict(MUON_ADAMW, Tiny), predict({**MUON_ADAMW, "step_in_backward": True}, Tiny)
    assert in_backward["state_bytes"] == plain["state_bytes"]
    assert plain["grad_bytes"] == plain["param_bytes"]
    assert in_backward["grad_bytes"] == max(p.numel() * 4 for p in tiny().parameters())
    assert "step_in_backward" in in_backward["note"]


def test_dcp_save_and_resume_exactly(tmp_path: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
    )

    straight = tiny()
    train(straight, optcore.build_optimizer(MUON_ADAMW, straight), range(6))
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    train(model, opt, range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=str(tmp_path))
        resumed = tiny(seed=5)
        opt2 = optcore.build_optimizer(MUON_ADAMW, resumed)
        state = {"model": get_model_state_dict(resumed), "optim": get_optimizer_state_dict(resumed, opt2)}
        dcp.load(state, checkpoint_id=str(tmp_path))
        set_model_state_dict(resumed, state["model"])
        set_optimizer_state_dict(resumed, opt2, state["optim"])
    assert all(part.state is opt2.state for part in opt2.parts.values())
    train(resumed, opt2, range(3, 6))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
