"""``optcore memory --check`` over every shipped optimizer and composite, in every
precision: the prediction on the meta device takes the path a CPU step takes
(a plugin's C kernel included, with the scratch it declares), so predicted and
measured agree figure for figure."""

from __future__ import annotations

import json

import pytest

from optcore.cli import main

pytest.importorskip("optcore_lion")
pytest.importorskip("optcore_adafactor")
pytest.importorskip("optcore_adascale")

MODEL = '''
import torch.nn as nn


def build():
    return nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))
'''

#: every shipped optimizer by each of its backends, and the composites
CONFIGS = {
    "lion": {"type": "optcore-lion:Lion", "lr": 1e-4},
    "lion-kernel": {"type": "optcore-lion:Lion", "lr": 1e-4, "fused": True},
    "lion-torch": {"type": "optcore-lion:Lion", "lr": 1e-4, "foreach": True},
    "adafactor": {"type": "optcore-adafactor:Adafactor"},
    "adafactor-manual-lr": {"type": "optcore-adafactor:Adafactor", "lr": 1e-3, "relative_step": False,
                            "scale_parameter": False, "beta1": 0.9},
    "adafactor-torch": {"type": "optcore-adafactor:Adafactor", "implementation": "torch"},
    "adascale": {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9, "num_gradients_to_accumulate": 2},
    "muon-adamw": {"type": "Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 1e-3}},
    "muon-lion": {"type": "Muon", "lr": 0.02, "fallback": {"type": "optcore-lion:Lion", "lr": 1e-4}},
    "muon-adafactor": {"type": "Muon", "lr": 0.02, "fallback": {"type": "optcore-adafactor:Adafactor"}},
}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_check_agrees_for_every_shipped_optimizer_and_composite(tmp_path, capsys, precision):
    (tmp_path / "tiny.py").write_text(MODEL)
    lineup = tmp_path / "lineup.json"
    lineup.write_text(json.dumps({"configs": [{"name": n, "optimizer": c} for n, c in CONFIGS.items()]}))
    rc = main(["memory", "--model", f"{tmp_path / 'tiny.py'}:build", "--config", str(lineup), "--check",
               "--precision", precision, "--json"])  # fmt: skip
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert set(rows) == set(CONFIGS)
    bad = {n: (r["status"], r["note"], r.get("differences")) for n, r in rows.items()
           if r["status"] != "ok" or r.get("differences")}  # fmt: skip
    assert not bad and rc == 0
    # the kernels' paths were predicted as kernels: Lion's one pass allocates nothing, its torch path does
    if precision == "fp32":
        assert rows["lion"]["transient_bytes"] == rows["lion-kernel"]["transient_bytes"] == 0
        assert rows["lion-torch"]["transient_bytes"] > 0
        assert 0 < rows["adafactor"]["transient_bytes"] < rows["adafactor-torch"]["transient_bytes"]


def test_a_single_sample_adascale_says_how_to_get_a_prediction(capsys):
    assert main(["memory", "--params", "10k", "--optimizers", "optcore-adascale:AdaScaleSGD", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["status"] == "not predicted" and "num_gradients_to_accumulate" in row["note"]
