"""The ``optcore memory`` command: inputs, precisions, sharding, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import optcore
from optcore.cli import main
from optcore.compare.memory import parse_count

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _memory(capsys, *args: str) -> dict:
    assert main(["memory", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _rows(doc: dict) -> dict:
    return {r["name"]: r for r in doc["rows"]}


@pytest.mark.parametrize(("text", "n"), [("7B", 7_000_000_000), ("125M", 125_000_000), ("1.5e3", 1500), ("42", 42)])
def test_counts(text, n):
    assert parse_count(text) == n


def test_params_count_fp32_and_bf16(capsys):
    rows = _rows(_memory(capsys, "--params", "7B", "--optimizers", "torch:AdamW,torch:SGD"))
    n = 7_000_000_000
    adamw = rows["torch:AdamW"]
    assert adamw["n_params"] == n and adamw["param_bytes"] == adamw["grad_bytes"] == 4 * n
    assert adamw["state_bytes"] == 8 * n + 4  # two moments and one step counter
    assert adamw["total_bytes"] == 16 * n + 4 and adamw["total_bytes_per_param"] == pytest.approx(16.0)
    assert rows["torch:SGD"]["state_bytes"] == 4 * n  # the line-up's momentum=0.9: one buffer
    if _has_fp16():
        rows = _rows(_memory(capsys, "--params", "1M", "--optimizers", "torch:AdamW", "--precision", "bf16"))
        row = rows["torch:AdamW"]
        assert row["param_bytes"] == 2_000_000 and row["master_bytes"] == 8_000_000  # fp32 copies + grads
        assert row["state_bytes"] == 8_000_000 + 8_000_000 + 4


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_adagrad_under_a_precision_wrapper_has_its_figure(capsys, precision):
    """Adagrad makes its state in its constructor: under the wrapper that state
    lives on the fp32 copy (4 B/param), beside the copy and its gradient (8), so
    the row is a figure, not a failure with checkpoint advice."""
    if not _has_fp16():
        pytest.skip("needs optcore-fp16")
    row = _rows(_memory(capsys, "--params", "1M", "--optimizers", "torch:Adagrad", "--precision", precision))["torch:Adagrad"]
    assert row["status"] == "ok" and not row["note"], row
    assert row["master_bytes"] == 8_000_000 and row["state_bytes"] == 12_000_000 + 4  # + the step counter


def _has_fp16() -> bool:
    try:
        optcore.resolve("FP16Optimizer")
    except optcore.OptcoreError:
        return False
    return True


def test_shape_dependent_state_is_flagged_for_a_bare_count(capsys):
    rows = _rows(_memory(capsys, "--params", "10M", "--optimizers", "optcore-adafactor:Adafactor,torch:AdamW"))
    if "optcore-adafactor:Adafactor" in rows and rows["optcore-adafactor:Adafactor"]["status"] == "ok":
        assert "depends on the parameter shapes" in rows["optcore-adafactor:Adafactor"]["note"]
    assert rows["torch:AdamW"]["note"] is None


def test_model_factory_world_size_and_outputs(tmp_path, capsys):
    out = tmp_path / "mem"
    args = ["memory", "--model", f"{EXAMPLES / 'my_task.py'}:make_model", "--optimizers", "torch:AdamW,torch:LBFGS",
            "--world-size", "4", "--zero-stage", "2", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "per rank" in printed and "not predicted" in printed
    doc = json.loads((out / "memory.json").read_text())
    adamw, lbfgs = doc["rows"]
    n = adamw["n_params"]
    assert n == 8 * 64 + 64 + 64 * 64 + 64 + 64 + 1
    # ZeRO-2 over 4 ranks: each param group (weights 4672, biases 129) flattened, padded to a multiple
    # of 2 * 4 and cut in 4: slices of 1168 and 34 elements; gradients and AdamW's two moments on them
    slices = 4672 // 8 * 2 + -(-129 // 8) * 2
    assert slices == 1168 + 34
    rank = adamw["per_rank"]
    assert rank["grad_bytes"] == 4 * slices and rank["param_bytes"] == 4 * n  # parameters whole at stage 2
    assert rank["state_bytes"] == 2 * 4 * slices + 2 * 4  # + one step counter per slice
    assert adamw["per_rank_bytes"] == rank["total_bytes"] == 4 * n + 3 * 4 * slices + 8
    assert adamw["sharding"] == "zero2" and doc["sharding"] == "zero2"  # --zero-stage 2 is --sharding zero2
    assert lbfgs["status"] == "not predicted" and lbfgs["state_bytes"] is None  # said so, not guessed
    assert (out / "memory.png").read_bytes()[:4] == b"\x89PNG"


def test_hf_config_is_built_on_meta(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, vocab_size=100, tie_word_embeddings=False)  # fmt: skip
    path = tmp_path / "config.json"
    config.to_json_file(path)
    rows = _rows(_memory(capsys, "--hf-config", str(path), "--optimizers", "torch:AdamW"))
    real = transformers.LlamaForCausalLM(config)
    n = sum(p.numel() for p in real.parameters())
    assert rows["torch:AdamW"]["n_params"] == n and rows["torch:AdamW"]["param_bytes"] == 4 * n


def test_bad_inputs_say_what_to_do(tmp_path, capsys):
    assert main(["memory", "--params", "lots"]) == 1
    assert "7B" in capsys.readouterr().err
    assert main(["memory", "--params", "1M", "--memory-efficient"]) == 1
    assert "bf16 or fp16" in capsys.readouterr().err


def test_the_table_is_one_line_per_config_within_100_columns_with_the_check_as_a_column(tmp_path, capsys):
    """Each config is one line (its name, what it resolved to where that is not torch's
    class of that name, its figures, the check); notes go under the table, and names
    from the user's file are text, never markup."""
    config = tmp_path / "lineup.json"
    config.write_text(json.dumps({"configs": [
        {"name": "[bold red]AdamW[/", "optimizer": {"type": "AdamW", "lr": 1e-3}},
        {"name": "plain SGD \x1b[2J", "optimizer": {"type": "SGD", "lr": 0.1, "momentum": 0.9}},
    ]}))  # fmt: skip
    assert main(["memory", "--params", "100k", "--config", str(config), "--check"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, out
    assert "\x1b" not in out, out
    header = next(line for line in lines if line.lstrip().startswith("config"))
    assert "check" in header.split() and "note" in header.split()
    adamw = [line for line in lines if "[bold red]AdamW[/" in line]
    assert len(adamw) == 1 and adamw[0].split()[-1] == "ok", out  # one row, checked, its name as written
    assert sum("SGD" in line for line in lines) == 1, out
    assert "every config: params 390.6 KiB, grads 390.6 KiB" in out
