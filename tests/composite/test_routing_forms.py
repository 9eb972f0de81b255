"""One routing for every form the parameters come in.

A composite's main type (Muon) leaves embeddings and the output head to the
fallback. The name rule must hold whether the model, ``dict(model.named_parameters())``,
``(name, tensor)`` pairs or param-group dicts with torch's ``param_names`` are passed:
a ``pos_embed`` (a 2-D ``nn.Parameter``, not an ``nn.Embedding``) once went to Muon
with a model and to AdamW with a dict.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import optcore

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch has no Muon")

MUON_ADAMW = {"type": "Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 3e-4}}


class Model(nn.Module):
    """Each routing rule that names carry, on 2-D parameters that are no nn.Embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(torch.randn(6, 8))  # ViT's position table
        self.wpe = nn.Parameter(torch.randn(6, 8))  # GPT-2's
        self.embed_tokens = nn.Linear(8, 8, bias=False)  # a Linear named like an embedding
        self.wte = nn.Parameter(torch.randn(16, 8))
        self.hidden = nn.Linear(8, 8)  # a hidden matrix and its bias
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4, bias=False)  # a top-level head
        self.decoder = nn.ModuleDict({"lm_head": nn.Linear(8, 4, bias=False)})  # an lm_head anywhere


EXPECTED = {
    "pos_embed": ("AdamW", "embedding"),
    "wpe": ("AdamW", "embedding"),
    "embed_tokens.weight": ("AdamW", "embedding"),
    "wte": ("AdamW", "embedding"),
    "hidden.weight": ("Muon", "2-D hidden matrix"),
    "hidden.bias": ("AdamW", "1-D"),
    "norm.weight": ("AdamW", "1-D"),
    "norm.bias": ("AdamW", "1-D"),
    "head.weight": ("AdamW", "output head"),
    "decoder.lm_head.weight": ("AdamW", "output head"),
}


def _forms(model: nn.Module) -> dict[str, object]:
    named = list(model.named_parameters())
    return {
        "module": model,
        "named dict": dict(named),
        "named pairs": named,
        "param groups with param_names": [
            {"params": [p for _, p in named[:4]], "param_names": [n for n, _ in named[:4]]},
            {"params": [p for _, p in named[4:]], "param_names": [n for n, _ in named[4:]]},
        ],
    }


@pytest.mark.parametrize("form", ["module", "named dict", "named pairs", "param groups with param_names"])
def test_every_rule_routes_alike_in_every_form(form):
    torch.manual_seed(0)
    model = Model()
    plan = optcore.plan(MUON_ADAMW, _forms(model)[form])
    assert {row["name"]: (row["optimizer"], row["why"]) for row in plan.routing} == EXPECTED


# explicit param-group dicts keep their own settings (no no-decay split), so only the named forms step alike
@pytest.mark.parametrize("form", ["named dict", "named pairs"])
def test_the_built_optimizer_steps_the_same_in_every_form(form):
    def run(make_params):
        torch.manual_seed(0)
        model = Model()
        opt = optcore.build_optimizer(MUON_ADAMW, make_params(model))
        for _ in range(3):
            opt.zero_grad()
            sum((p.float() ** 2).sum() for p in model.parameters()).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(lambda m: m), run(lambda m: _forms(m)[form])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_unnamed_matrices_are_routed_by_shape_with_a_warning_naming_the_way_out():
    torch.manual_seed(0)
    model = Model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = optcore.plan(MUON_ADAMW, list(model.parameters()))
    assert sum(row["optimizer"] == "Muon" for row in plan.routing) == 7  # every 2-D parameter
    text = " ".join(str(w.message) for w in caught)
    assert "without a name" in text and "named_parameters" in text


def test_named_forms_raise_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optcore.plan(MUON_ADAMW, dict(Model().named_parameters()))


def test_torchs_named_param_groups_build_a_plain_optimizer_too():
    model = nn.Linear(4, 2)
    named = list(model.named_parameters())
    groups = [{"params": [p for _, p in named], "param_names": [n for n, _ in named]}]
    opt = optcore.build_optimizer({"type": "AdamW"}, groups)
    assert opt.param_groups[0]["param_names"] == ["weight", "bias"]
