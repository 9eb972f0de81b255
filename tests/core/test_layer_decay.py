"""The config key ``layer_decay`` (optcore.layerwise) on models that are not
timm's: the numbered-blocks rule docs/getting-started.md states, the values it
takes, how it meets ``param_groups``, schedules and composites. Against timm's
own grouping of timm's models: tests/integrations/test_layer_decay_timm.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import optcore


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Linear(d, d)


class TinyGPT(nn.Module):
    """GPT-2's names: wte, wpe, h.<k>, ln_f, lm_head."""

    def __init__(self, blocks: int = 3, d: int = 4) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(10, d), nn.Embedding(8, d)
        self.h = nn.ModuleList(Block(d) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, 10, bias=False)


def named_groups(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {g["name"]: [names[id(p)] for p in g["params"]] for g in optimizer.param_groups}


CONFIG = {"type": "AdamW", "lr": 1e-3, "weight_decay": 0.1, "layer_decay": 0.5}


def test_blocks_embeddings_and_head_by_name():
    model = TinyGPT(blocks=3)
    optimizer = optcore.build_optimizer(CONFIG, model)
    assert named_groups(optimizer, model) == {
        "layer_0_decay": ["wte.weight", "wpe.weight"],
        **{g: n for k in range(3) for g, n in (
            (f"layer_{k + 1}_no_decay", [f"h.{k}.ln.weight", f"h.{k}.ln.bias", f"h.{k}.mlp.bias"]),
            (f"layer_{k + 1}_decay", [f"h.{k}.mlp.weight"]))},
        "layer_4_no_decay": ["ln_f.weight", "ln_f.bias"],
        "layer_4_decay": ["lm_head.weight"],
    }  # fmt: skip
    for group in optimizer.param_groups:
        layer = int(group["name"].split("_")[1])
        assert group["lr_scale"] == 0.5 ** (4 - layer)  # layer_decay ** (num_blocks + 1 - layer)
        assert group["lr"] == pytest.approx(1e-3 * group["lr_scale"])
        assert group["weight_decay"] == (0.0 if group["name"].endswith("no_decay") else 0.1)
    assert optimizer.get_lr() == pytest.approx(1e-3)
    optimizer.set_lr(2e-3)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([2e-3 * g["lr_scale"] for g in optimizer.param_groups])


def test_the_container_with_the_most_numbered_children_holds_the_blocks():
    model = nn.Module()
    model.stem = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))  # numbered too, but two
    model.layers = nn.ModuleList(nn.Linear(2, 2, bias=False) for _ in range(3))
    model.head = nn.Linear(2, 2, bias=False)
    optimizer = optcore.build_optimizer({"type": "SGD", "lr": 1.0, "layer_decay": 0.5}, model)
    groups = named_groups(optimizer, model)
    # biases are their layer's no-decay group even at weight_decay=0, as timm splits them
    assert groups["layer_0_decay"] == ["stem.0.weight", "stem.1.weight"]
    assert groups["layer_0_no_decay"] == ["stem.0.bias", "stem.1.bias"]
    assert [groups[f"layer_{k}_decay"] for k in (1, 2, 3)] == [["layers.0.weight"], ["layers.1.weight"], ["layers.2.weight"]]
    assert groups["layer_4_decay"] == ["head.weight"]


def test_a_named_dict_groups_as_the_model_does():
    model = TinyGPT(blocks=2)
    from_model = optcore.build_optimizer(CONFIG, model)
    from_dict = optcore.build_optimizer(CONFIG, dict(model.named_parameters()))
    assert [(g["name"], g["lr_scale"], g["weight_decay"], [id(p) for p in g["params"]]) for g in from_model.param_groups] == [
        (g["name"], g["lr_scale"], g["weight_decay"], [id(p) for p in g["params"]]) for g in from_dict.param_groups
    ]


def test_off_by_default_and_with_null():
    model = TinyGPT()
    plain = optcore.build_optimizer({k: v for k, v in CONFIG.items() if k != "layer_decay"}, model)
    null = optcore.build_optimizer({**CONFIG, "layer_decay": None}, model)
    assert [g["name"] for g in plain.param_groups] == [g["name"] for g in null.param_groups] == ["decay", "no_decay"]


@pytest.mark.parametrize("value", [0, 1.5, -0.5, "fast", True, float("nan")])
def test_values_outside_0_1_are_refused_by_check_and_build(value):
    for road in (lambda c: optcore.plan(c), lambda c: optcore.build_optimizer(c, TinyGPT())):
        with pytest.raises(optcore.ConfigError, match="layer_decay") as caught:
            road({**CONFIG, "layer_decay": value})
        assert any(field == "layer_decay" for field, _ in caught.value.problems)


def test_a_string_number_is_read_as_the_number():
    optimizer = optcore.build_optimizer({**CONFIG, "layer_decay": "0.5"}, TinyGPT())
    assert sorted({g["lr_scale"] for g in optimizer.param_groups}) == [0.0625, 0.125, 0.25, 0.5, 1.0]


def test_what_cannot_be_grouped_by_layer_is_refused():
    model = TinyGPT()
    with pytest.raises(optcore.ConfigError, match="without names"):
        optcore.build_optimizer(CONFIG, list(model.parameters()))
    with pytest.raises(optcore.ConfigError, match="explicit param-group dicts"):
        optcore.build_optimizer(CONFIG, [{"params": list(model.parameters())}])
    flat = nn.Sequential()
    flat.add_module("encoder", nn.Linear(2, 2))
    flat.add_module("head", nn.Linear(2, 2))
    with pytest.raises(optcore.ConfigError, match="numbered blocks.*param_groups' and 'lr_scale'"):
        optcore.build_optimizer(CONFIG, flat)


def test_a_config_param_group_overrides_the_layers_scale():
    model = TinyGPT()
    config = {**CONFIG, "param_groups": [{"params": r"^lm_head\.", "lr_scale": 10.0, "name": "head"}]}
    optimizer = optcore.build_optimizer(config, model)
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert groups["head"]["lr_scale"] == 10.0 and groups["head"]["lr"] == pytest.approx(1e-2)
    assert groups["layer_0_decay"]["lr_scale"] == 0.0625  # the others keep their layer's


def test_a_schedule_keeps_each_layers_ratio():
    model = TinyGPT()
    optimizer, scheduler = optcore.build(
        {"optimizer": CONFIG, "lr_scheduler": {"type": "cosine", "warmup_steps": 1}}, model, num_training_steps=10
    )
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    top = optimizer.get_lr()
    assert 0 < top < 1e-3
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(top * group["lr_scale"])


def test_a_composite_scales_each_parts_groups():
    model = TinyGPT()
    config = {"type": "Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 3e-4}, "layer_decay": 0.5}
    optimizer = optcore.build_optimizer(config, model)
    by_param = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        group = by_param[id(p)]
        base = 0.02 if group["optimizer"] == "Muon" else 3e-4
        layer = 0 if name.startswith("w") else 4 if name.startswith(("ln_f", "lm_head")) else int(name.split(".")[1]) + 1
        assert group["lr_scale"] == 0.5 ** (4 - layer), name
        assert group["lr"] == pytest.approx(base * group["lr_scale"]), name


def test_timms_protocol_group_matcher_and_no_weight_decay():
    """A model with timm's ``group_matcher()`` is grouped by it (MATCH_PREV_GROUP,
    99999, joins the group before; unmatched names are the top layer), with timm's
    weight-decay rule: 1-D parameters and ``no_weight_decay()`` names get none."""

    class TimmLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos_embed = nn.Parameter(torch.zeros(1, 2, 4))
            self.patch = nn.Linear(4, 4)
            self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
            self.norm = nn.LayerNorm(4)
            self.head = nn.Linear(4, 3)

        def group_matcher(self, coarse: bool = False) -> dict:
            return {"stem": r"^pos_embed|patch", "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]}

        def no_weight_decay(self) -> set[str]:
            return {"pos_embed"}

    model = TimmLike()
    optimizer = optcore.build_optimizer(CONFIG, model)
    assert named_groups(optimizer, model) == {
        "layer_0_no_decay": ["pos_embed", "patch.bias"],
        "layer_0_decay": ["patch.weight"],
        "layer_1_decay": ["blocks.0.weight"],
        "layer_1_no_decay": ["blocks.0.bias"],
        "layer_2_decay": ["blocks.1.weight"],
        "layer_2_no_decay": ["blocks.1.bias", "norm.weight", "norm.bias"],  # the final norm joins the last block
        "layer_3_decay": ["head.weight"],
        "layer_3_no_decay": ["head.bias"],
    }
    assert {g["name"]: g["lr_scale"] for g in optimizer.param_groups}["layer_0_decay"] == 0.125


def test_a_precision_wrapper_hands_layer_decay_to_the_optimizer_inside():
    pytest.importorskip("optcore_fp16")
    model = TinyGPT().to(torch.bfloat16)
    wrapper = optcore.build_optimizer({**CONFIG, "precision": "bf16"}, model)
    inner = optcore.unwrap(wrapper)
    inner = getattr(inner, "optimizer", inner)  # the optimizer the wrapper steps
    assert sorted({g["lr_scale"] for g in inner.param_groups}) == [0.0625, 0.125, 0.25, 0.5, 1.0]
    assert all(g["lr"] == pytest.approx(1e-3 * g["lr_scale"]) for g in inner.param_groups)
