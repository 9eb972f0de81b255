"""``optcore memory --sharding`` and ``--check``: what one rank holds, the step's
transient peak apart from resident memory, and a real step beside the prediction
for every torch and shipped optimizer (tensor storages, not the process's RSS)."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from torch import nn

import optcore
from optcore.cli import main
from optcore.compare.memory import _accumulations, predict, predict_all
from optcore.compare.memory_check import differences, measure
from optcore.compare.memory_shard import fsdp2_chunk, on_mesh, zero_slice
from optcore.testing import inputs_for

pytestmark = pytest.mark.filterwarnings("ignore")


class Uneven(nn.Module):
    """First dims that three ranks do not divide, a matrix with fewer rows than ranks, an embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 2, bias=False)
        self.emb = nn.Embedding(10, 4)


def _matrices() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 7, bias=False), nn.Linear(7, 30, bias=False))


def test_fsdp2_rank_holds_its_padded_dim0_chunk() -> None:
    (row,) = predict_all([{"name": "a", "optimizer": {"type": "torch:AdamW"}}], Uneven, world_size=3, sharding="fsdp2")
    # rank 0's chunks: ceil(7/3)=3 rows of 5, 3 of the bias, ceil(2/3)=1 row of 7, ceil(10/3)=4 rows of 4
    local = 3 * 5 + 3 + 1 * 7 + 4 * 4
    rank = row["per_rank"]
    assert rank["param_bytes"] == rank["grad_bytes"] == 4 * local
    assert rank["state_bytes"] == 2 * 4 * local + 4 * 4  # two moments of the local shape, a step per tensor
    assert row["per_rank_bytes"] == rank["total_bytes"] == 4 * local * 4 + 16
    assert fsdp2_chunk(torch.Size([7, 5]), 4) == (torch.Size([2, 5]), 10)
    assert fsdp2_chunk(torch.Size([2, 3]), 4) == (torch.Size([1, 3]), 3)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_shard_flat_slices_of_each_group(stage: int) -> None:
    (row,) = predict_all([{"name": "a", "optimizer": {"type": "torch:AdamW"}}], Uneven, world_size=3,
                         sharding=f"zero{stage}")  # fmt: skip
    decay, no_decay = [7 * 5, 2 * 7, 10 * 4], [7]  # weights and the embedding; the bias
    whole = sum(decay) + sum(no_decay)
    if stage == 3:
        assert zero_slice(decay, 3, 3) == 12 + 5 + 14
        slices = zero_slice(decay, 3, 3) + zero_slice(no_decay, 3, 3)
    else:
        assert zero_slice(decay, 1, 3) == math.ceil(89 / 6) * 2 == 30  # padded to a multiple of 2 per rank
        assert zero_slice(no_decay, 1, 3) == 2 * 2
        slices = 30 + 4
    rank = row["per_rank"]
    assert rank["state_bytes"] == 2 * 4 * slices + 2 * 4
    assert rank["grad_bytes"] == 4 * (slices if stage >= 2 else whole)
    assert rank["param_bytes"] == 4 * (slices if stage == 3 else whole)


def test_coupled_updates_are_named_not_guessed_under_sharding() -> None:
    rows = predict_all([{"name": "muon", "optimizer": {"type": "torch:Muon"}},
                        {"name": "sib", "optimizer": {"type": "torch:AdamW", "step_in_backward": True}}],
                       _matrices, world_size=2, sharding="zero1")  # fmt: skip
    assert rows[0]["per_rank"] is None and "per_tensor" not in rows[0]["per_rank_note"]
    assert "whole tensor" in rows[0]["per_rank_note"] and "zero1" in rows[0]["per_rank_note"]
    assert rows[1]["per_rank"] is None and "several ranks" in rows[1]["per_rank_note"]
    # under FSDP2 torch's Muon is gathered to owner ranks (tests/distributed/test_muon_fsdp2.py checks a real run)
    (muon,) = predict_all([{"name": "muon", "optimizer": {"type": "torch:Muon"}}], _matrices, world_size=2,
                          sharding="fsdp2")  # fmt: skip
    assert muon["per_rank"]["state_bytes"] == 4 * (4 * 12 + 15 * 7)  # rank 0's rows of each momentum
    (adafactor,) = predict_all([{"name": "f", "optimizer": {"type": "torch:Adafactor"}}], _matrices, world_size=2,
                               sharding="zero1")  # fmt: skip
    assert "factored" in adafactor["per_rank_note"]


def test_fsdp2_adafactor_and_adascale_state_of_rank0s_rows() -> None:
    """optcore-adafactor steps FSDP2's shards with statistics reduced over the mesh;
    tests/memory/test_memory_fsdp2.py compares these figures with a real run."""
    configs = [{"name": "f", "optimizer": {"type": "optcore-adafactor:Adafactor"}},
               {"name": "m", "optimizer": {"type": "optcore-adafactor:Adafactor", "beta1": 0.9, "lr": 1e-2,
                                           "relative_step": False}},
               {"name": "s", "optimizer": {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9}},
               {"name": "t", "optimizer": {"type": "torch:Adafactor"}}]  # fmt: skip
    factored, moment, adascale, torch_adafactor = predict_all(configs, Uneven, world_size=3, sharding="fsdp2")
    # rank 0's rows: fc1.weight 3 of 7, fc1.bias 3 of 7, fc2.weight 1 of 2, emb.weight 4 of 10
    rows, local = 3 + 1 + 4, 3 * 5 + 3 + 1 * 7 + 4 * 4
    cols = 5 + 7 + 4  # a matrix's column statistic is replicated: all of it on every rank
    state = 4 * (rows + cols + 3 + 4)  # the vector's second moment has its 3 rows; one 0-dim RMS per tensor
    assert factored["per_rank"]["state_bytes"] == state
    assert moment["per_rank"]["state_bytes"] == state + 4 * local  # the first moment has the local shape
    # the step holds G² + eps1 of the local shape while phase 1's float64 sums (sum X², a split matrix's
    # column sums and sum of its row statistic) are reduced in one buffer
    reduced = 8 * ((1 + 5 + 1) + 1 + (1 + 7 + 1) + (1 + 4 + 1))
    assert factored["per_rank"]["transient_bytes"] >= 4 * local + reduced
    assert adascale["status"] == "not predicted"  # one process gives one gradient sample
    # momentum of the local shape; the gain's float64 statistics: two running averages, each with its biased,
    # unbiased and total forms and a count, and the progress
    assert adascale["per_rank"]["state_bytes"] == 4 * local + 8 * (2 * (1 + 3 + 1) + 1)
    # backward passes accumulate on FSDP2's unsharded parameters: the state the step sees is the same
    accumulating = {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9, "num_gradients_to_accumulate": 2}
    (twice,) = predict_all([{"name": "a", "optimizer": accumulating}], Uneven, world_size=3, sharding="fsdp2")
    assert twice["per_rank"] == adascale["per_rank"]
    assert torch_adafactor["per_rank"] is None and torch_adafactor["per_rank_note"].startswith("refused under fsdp2")
    assert "optcore-adafactor" in torch_adafactor["per_rank_note"]


def test_transient_peak_is_the_implementations_temporaries() -> None:
    """torch's fused kernel updates in place; its foreach path allocates lists of
    temporaries: the step peak tells them apart while the resident state is the same."""
    fused = predict({"type": "torch:AdamW"}, _matrices)
    foreach = predict({"type": "torch:AdamW", "foreach": True}, _matrices)
    assert fused["state_bytes"] == foreach["state_bytes"]
    assert fused["transient_bytes"] == 0
    n = 12 * 7 + 7 * 30
    assert 4 * n <= foreach["transient_bytes"] <= 4 * 4 * n
    for cfg, row in (({"type": "torch:AdamW"}, fused), ({"type": "torch:AdamW", "foreach": True}, foreach)):
        assert measure(cfg, _matrices)["transient_bytes"] == row["transient_bytes"]


def _shipped() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        specs = optcore.list_optimizers(all=True)
    return [s for s in specs if (s.source == "torch" or s.provider.startswith("optcore-")) and not s.is_wrapper]


SHIPPED = _shipped()
PRECISION = [{"type": "torch:AdamW", "precision": "bf16"}, {"type": "optcore-lion:Lion", "precision": "bf16"},
             {"type": "torch:SGD", "momentum": 0.9, "precision": "fp16"}]  # fmt: skip


#: the shipped plugins with CPU C kernels, and a config that steps their torch path (None: that path
#: keeps a CPU workspace of its own, optcore-lion's chunk buffer for its chunked loop)
NATIVE = {"optcore-lion:Lion": None, "optcore-adafactor:Adafactor": {"implementation": "torch"}}


def _check(config: dict, factory, sharding: str | None = None, world_size: int = 1, native_kernel: bool = False) -> dict:
    (row,) = predict_all([{"name": "x", "optimizer": config}], factory, world_size=world_size, sharding=sharding)
    if row["status"] != "ok" and row.get("per_rank") is None:
        return row
    measured = measure(row["config"], factory, _accumulations(row["config"]), sharding, world_size,
                       whole=row["status"] == "ok")  # fmt: skip
    differ = differences(row, measured)
    if native_kernel:  # its scratch memory is not tensors, and the meta device takes the torch path
        differ = [d for d in differ if "transient" not in d]
    assert differ == [], (config, sharding)
    return row


@pytest.mark.parametrize("spec", SHIPPED, ids=[s.qualified for s in SHIPPED])
def test_check_measures_what_was_predicted(spec) -> None:
    inputs = inputs_for(spec)
    config = {"type": spec.qualified, **inputs.config}
    factories = [_matrices] if inputs.matrices_only else [Uneven, _matrices]
    native = spec.qualified in NATIVE
    for factory in factories:
        row = _check(config, factory, native_kernel=native)
        if row["status"] == "not predicted":
            assert inputs.needs_closure or "*" in inputs.skip, row["note"]
            if on_mesh(config, "fsdp2"):  # AdaScaleSGD: not in one process, on every rank of several; LBFGS: refused
                sharded = _check(config, factory, "fsdp2", 3)
                assert sharded["per_rank"] is not None or "refused under fsdp2" in sharded["per_rank_note"]
            return
        if row["status"] == "failed":
            pytest.skip(f"does not build with its conformance inputs: {row['note']}")
        if NATIVE.get(spec.qualified):  # on the torch path every figure is exact, the transient included
            _check({**config, **NATIVE[spec.qualified]}, factory)
        for sharding in ("fsdp2", "zero2", "zero3"):
            sharded = _check(config, factory, sharding, 3, native_kernel=native)
            if sharding == "fsdp2" and on_mesh(config, sharding):  # its own DTensor path, or refused
                assert sharded["per_rank"] is not None or "refused under fsdp2" in sharded["per_rank_note"]


@pytest.mark.parametrize("config", PRECISION, ids=lambda c: f"{c['type']}-{c['precision']}")
def test_check_under_precision_wrappers(config: dict) -> None:
    try:
        optcore.resolve("FP16Optimizer")
    except optcore.OptcoreError:
        pytest.skip("optcore-fp16 is not installed")
    # optcore-fp16 checks for overflow and copies with a CPU C kernel of its own: the transient differs there
    assert _check(config, Uneven, native_kernel=True)["status"] == "ok"


def test_check_cli_prints_measured_and_fails_on_a_difference(capsys, monkeypatch) -> None:
    args = ["memory", "--model", "tests.memory.test_memory_sharding:Uneven", "--optimizers", "torch:AdamW,torch:SGD",
            "--sharding", "zero2", "--world-size", "3", "--check", "--json"]  # fmt: skip
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["check"] and all(r["measured"]["per_rank"] == r["per_rank"] for r in doc["rows"])
    import optcore.compare.memory_check as check

    real = check.measure
    monkeypatch.setattr(check, "measure", lambda *a, **k: {**real(*a, **k), "state_bytes": 1})
    assert main(args) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any("state:" in d and "1 B measured" in d for d in doc["rows"][0]["differences"])


def test_old_and_new_sharding_flags(capsys) -> None:
    base = ["memory", "--params", "1000", "--optimizers", "torch:AdamW", "--json", "--world-size", "2"]
    assert main([*base, "--zero-stage", "3"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert main([*base, "--sharding", "zero3"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["per_rank"] == old["rows"][0]["per_rank"]
    assert main([*base, "--zero-stage", "2", "--sharding", "fsdp2"]) == 1
    assert "--sharding alone" in capsys.readouterr().err
    assert main(base) == 1
    assert "--sharding" in capsys.readouterr().err


@pytest.mark.parametrize("config", [
    {"type": "torch:Muon", "lr": 0.02, "fallback": {"type": "torch:AdamW", "lr": 1e-3}},
    {"type": "torch:AdamW", "step_in_backward": True},
    {"type": "torch:AdamW", "param_groups": [{"params": r"^fc1\.", "optimizer": {"type": "optcore-lion:Lion"}}]},
], ids=["muon-adamw", "step-in-backward", "group-optimizer"])  # fmt: skip
def test_check_composites_and_step_in_backward(config: dict) -> None:
    if "torch:Muon" in str(config) and not hasattr(torch.optim, "Muon"):
        pytest.skip("this torch has no Muon")
    row = _check(config, Uneven, native_kernel="Lion" in str(config))
    assert row["status"] == "ok", row["note"]
    if config.get("step_in_backward"):
        assert row["grad_bytes"] == max(p.numel() * 4 for p in Uneven().parameters())
