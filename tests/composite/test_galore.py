"""GaLore (galore-torch) by name: routed to the hidden matrices through the composite
form, equal to galore_torch's own class over the same split, resumed exactly from a
``weights_only`` checkpoint, and counted exactly by ``optcore memory``."""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import optcore

galore_torch = pytest.importorskip("galore_torch")
pytestmark = pytest.mark.filterwarnings("ignore")

RANK = 4
CONFIG = {"type": "GaLoreAdamW", "lr": 1e-2, "rank": RANK, "update_proj_gap": 2, "scale": 0.5,
          "fallback": {"type": "AdamW", "lr": 1e-3}}  # fmt: skip


class Tiny(nn.Module):
    """An embedding, two hidden matrices (one wide, one tall), biases and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)
        self.head = nn.Linear(16, 20, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.relu(self.up(self.embed(x)))))


def _model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def _train(model: nn.Module, opts: list[Any], steps: range) -> None:
    for i in steps:
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 20, (4, 6), generator=g)
        for opt in opts:
            opt.zero_grad()
        nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        for opt in opts:
            opt.step()


def test_routed_to_the_hidden_matrices_with_its_rank_in_their_groups() -> None:
    model = _model()
    opt = optcore.build_optimizer(CONFIG, model)
    by_optimizer: dict[str, set[str]] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for g in opt.param_groups:
        by_optimizer.setdefault(g["optimizer"], set()).update(names[id(p)] for p in g["params"])
        assert (g.get("rank"), g.get("update_proj_gap"), g.get("scale")) == (
            (RANK, 2, 0.5) if g["optimizer"] == "GaLoreAdamW" else (None, None, None))
    assert by_optimizer == {"GaLoreAdamW": {"up.weight", "down.weight"},
                            "AdamW": {"embed.weight", "head.weight", "up.bias", "down.bias"}}  # fmt: skip
    assert opt.sharding == "per_tensor"  # the projection is of the whole matrix
    with pytest.raises(optcore.ConfigError, match="fallback"):
        optcore.build_optimizer({k: v for k, v in CONFIG.items() if k != "fallback"}, _model())


def test_equals_galore_torch_over_the_same_split() -> None:
    model = _model()
    _train(model, [optcore.build_optimizer(CONFIG, model)], range(5))
    by_hand = _model()
    matrices = [by_hand.up.weight, by_hand.down.weight]
    rest = [p for p in by_hand.parameters() if all(p is not m for m in matrices)]
    galore = galore_torch.GaLoreAdamW([{"params": matrices, "rank": RANK, "update_proj_gap": 2, "scale": 0.5,
                                        "proj_type": "std"}], lr=1e-2, weight_decay=0.0, no_deprecation_warning=True)  # fmt: skip
    decay = [by_hand.embed.weight, by_hand.head.weight]
    adamw = torch.optim.AdamW([{"params": decay}, {"params": [p for p in rest if p.ndim == 1], "weight_decay": 0.0}],
                              lr=1e-3, foreach=False)  # fmt: skip
    _train(by_hand, [galore, adamw], range(5))
    for (name, a), b in zip(model.named_parameters(), by_hand.parameters()):
        assert torch.equal(a, b), name


def test_resumes_exactly_from_a_weights_only_checkpoint() -> None:
    straight = _model()
    _train(straight, [optcore.build_optimizer(CONFIG, straight)], range(6))
    first = _model()
    opt = optcore.build_optimizer(CONFIG, first)
    _train(first, [opt], range(3))  # mid-way between two projection updates
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # the projector is saved as tensors and numbers
    resumed = _model()
    resumed.load_state_dict(saved["model"])
    opt2 = optcore.build_optimizer(CONFIG, resumed)
    opt2.load_state_dict(saved["opt"])
    assert type(opt2.state[resumed.up.weight]["projector"]).__name__ == "GaLoreProjector"
    _train(resumed, [opt2], range(3, 6))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_param_groups_own_optimizer() -> None:
    config = {"type": "AdamW", "lr": 1e-3,
              "param_groups": [{"params": r"^(up|down)\.weight$", "optimizer": {"type": "GaLoreAdamW", "rank": 2}}]}
    model = _model()
    opt = optcore.build_optimizer(config, model)
    _train(model, [opt], range(2))
    assert opt.state[model.up.weight]["exp_avg"].shape == (32, 2)  # (32, 16): the shorter side projected to rank 2
    assert opt.state[model.down.weight]["exp_avg"].shape == (2, 32)  # (16, 32)
    assert opt.state[model.up.bias]["exp_avg"].shape == (32,)


def test_memory_counts_the_projected_state_exactly() -> None:
    from optcore.compare.memory import predict
    from optcore.compare.memory_check import differences, measure

    row = predict(CONFIG, _model)
    assert row["status"] == "ok", row["note"]
    measured = measure(CONFIG, _model)
    assert differences(row, measured) == []
    # up (32, 16): moments (32, 4) each; its projection is Vh[:4] of the gradient's SVD, a view that keeps
    # all of Vh (16 x 16) alive. down (16, 32): moments (4, 32); U[:, :4] keeps U (16 x 16).
    moments = 2 * (32 * RANK + RANK * 32) * 4
    projections = (16 * 16 + 16 * 16) * 4
    assert row["state_by_optimizer"]["GaLoreAdamW"] == moments + projections
    full_adamw = predict({"type": "AdamW", "lr": 1e-3}, _model)["state_bytes"]
    assert row["state_bytes"] == full_adamw - 2 * 2 * 32 * 16 * 4 - 2 * 4 + moments + projections


def test_the_8bit_variant_names_what_it_needs() -> None:
    from optcore.compare.memory import predict
    from optcore.testing import inputs_for

    reason = inputs_for(optcore.resolve("GaLoreAdamW8bit")).skip.get("*")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the kit runs GaLoreAdamW8bit")
    assert reason and "CUDA" in reason
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = predict({**CONFIG, "type": "GaLoreAdamW8bit"}, _model)
    assert row["status"] == "not predicted" and "CUDA" in row["note"]


def test_bitsandbytes_8bit_fallback_on_the_cpu() -> None:
    """bitsandbytes' 8-bit AdamW steps the rest on the CPU, and memory counts its codes and scales."""
    pytest.importorskip("bitsandbytes")
    from optcore.compare.memory import predict
    from optcore.compare.memory_check import differences, measure

    config = {**CONFIG, "fallback": {"type": "bitsandbytes.optim:AdamW8bit", "lr": 1e-3, "min_8bit_size": 256}}
    model = _model()
    opt = optcore.build_optimizer(config, model)
    _train(model, [opt], range(2))
    assert opt.state[model.embed.weight]["state1"].dtype == torch.uint8  # 320 elements: above min_8bit_size
    row = predict(config, _model)
    assert row["status"] == "ok", row["note"]
    assert differences(row, measure(config, _model)) == []
    assert row["state_by_optimizer"]["AdamW8bit"] < predict(CONFIG, _model)["state_by_optimizer"]["AdamW"]


def test_dcp_save_and_resume_exactly(tmp_path: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
    )

    straight = _model()
    _train(straight, [optcore.build_optimizer(CONFIG, straight)], range(6))
    model = _model()
    opt = optcore.build_optimizer(CONFIG, model)
    _train(model, [opt], range(3))
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=str(tmp_path))  # fmt: skip
    torch.manual_seed(5)
    resumed = Tiny()
    opt2 = optcore.build_optimizer(CONFIG, resumed)
    state = {"model": get_model_state_dict(resumed), "optim": get_optimizer_state_dict(resumed, opt2)}
    dcp.load(state, checkpoint_id=str(tmp_path))
    set_model_state_dict(resumed, state["model"])
    set_optimizer_state_dict(resumed, opt2, state["optim"])
    _train(resumed, [opt2], range(3, 6))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("field", "value"),
    [("rank", 0), ("rank", -2), ("update_proj_gap", 0), ("scale", 0.0), ("scale", -1.0), ("proj_type", "diag")],
)
def test_a_projection_setting_out_of_range_is_refused_by_name_at_build_and_check(field: str, value: Any) -> None:
    config = {**CONFIG, field: value}
    with pytest.raises(optcore.ConfigError) as caught:
        optcore.build_optimizer(config, _model())
    assert [f for f, _ in caught.value.problems] == [field]
    with pytest.raises(optcore.ConfigError):
        optcore.plan(config)  # what optcore check runs: no model needed to refuse it
