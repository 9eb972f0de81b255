"""``optcore compare`` / ``optcore train`` and the embedded task.

Runs are a few steps long, in-process except where the spawn path itself is tested.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import optcore
from optcore.files import load_config_file
from optcore.cli import main
from optcore.compare import lineup
from optcore.compare.runner import run_one
from optcore.compare.train import RunSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RESULT_KEYS = {
    "name", "config", "status", "error", "losses", "val_losses", "final", "best", "best_step", "steps_per_s",
    "n_params", "state_bytes", "master_bytes", "state_bytes_per_param", "peak_rss", "peak_rss_delta",
    "skipped_steps", "loss_scale", "warnings",
}  # fmt: skip


def _run(config: dict, steps: int = 4, seed: int = 0, **entry) -> dict:
    """In this process, on one thread (as compare does: 2 threads on a busy 2-core machine crawl)."""
    return run_one({"name": "x", "optimizer": config, **entry}, RunSettings(steps=steps, seed=seed), False)


def _installed(name: str) -> bool:
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optcore.resolve(name)
    except optcore.OptcoreError:
        return False
    return True


def test_compare_cli_writes_table_json_and_png(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["compare", "--optimizers", "AdamW,torch:SGD", "--steps", "6", "--seed", "3", "--device", "cpu",
               "--out", str(out), "--in-process", "--quiet"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "AdamW" in printed and "torch:SGD" in printed and "results.json" in printed

    doc = json.loads((out / "results.json").read_text())
    assert doc["settings"]["steps"] == 6 and doc["settings"]["seeds"] == [3] and doc["settings"]["device"] == "cpu"
    assert doc["settings"]["isolation"] == "in-process" and doc["complete"] and not doc["interrupted"]
    assert doc["task"]["name"] == "char-lm" and "2 layers, d=64" in doc["task"]["description"]
    assert [r["name"] for r in doc["results"]] == ["AdamW", "torch:SGD"]
    for r in doc["results"]:
        assert RESULT_KEYS <= set(r)
        assert r["status"] == "ok" and r["error"] is None
        assert len(r["losses"]) == 6 and r["val_losses"][0][0] == 0 and r["val_losses"][-1][0] == 6
        assert r["final"] == r["val_losses"][-1][1] and r["best"] <= r["final"]
        assert r["steps_per_s"] > 0 and r["peak_rss"] > 0 and r["skipped_steps"] is None
    adamw, sgd = doc["results"]
    assert adamw["config"]["optimizer"] == {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.01}  # the line-up's
    assert adamw["built"] == "torch:AdamW" and sgd["built"] == "torch:SGD"
    assert [r["rank"] for r in doc["rows"]] in (["1", "2"], ["1=", "1="]) and len(doc["rows"]) == 2
    assert adamw["state_bytes_per_param"] == pytest.approx(8.0, abs=0.01)  # exp_avg + exp_avg_sq, fp32
    assert sgd["state_bytes_per_param"] == pytest.approx(4.0, abs=0.01)  # the momentum buffer
    assert (out / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_seed_same_losses_other_seed_other_losses():
    config = {"type": "AdamW", "lr": 1e-2}
    first, again, other = _run(config), _run(config), _run(config, seed=1)
    assert first["losses"] == again["losses"] and first["val_losses"] == again["val_losses"]
    assert first["losses"] != other["losses"]


def test_a_fresh_process_gives_the_same_losses():
    entry = {"name": "AdamW", "optimizer": {"type": "AdamW", "lr": 1e-2}}
    settings = RunSettings(steps=3)
    steps_seen = []
    isolated = run_one(entry, settings, isolate=True, report=lambda step, loss: steps_seen.append(step))
    here = run_one(entry, settings, isolate=False)
    assert isolated["status"] == "ok" and isolated["losses"] == here["losses"]
    assert steps_seen == [1, 2, 3]


class Boom(torch.optim.SGD):
    """Builds fine, raises on the second step."""

    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2:
            raise RuntimeError("kaboom")
        return super().step(closure)


@pytest.fixture
def boom():
    optcore.register_optimizer("BoomForCompare", Boom)
    yield "BoomForCompare"
    optcore.unregister_optimizer("BoomForCompare")


def test_the_notes_describe_how_the_runs_were_made_not_the_last_command(tmp_path):
    from optcore.compare.study import MEMORY_NOTES, run_notes

    out = tmp_path / "out"
    args = ["compare", "--optimizers", "AdamW", "--steps", "4", "--device", "cpu", "--out", str(out), "--quiet"]
    assert main([*args, "--in-process"]) == 0
    assert main(args) == 0  # the same sweep again, without --in-process: nothing is left to run
    doc = json.loads((out / "results.json").read_text())
    assert [r["isolation"] for r in doc["results"]] == ["in-process"]
    assert doc["settings"]["isolation"] == "in-process" and doc["memory_note"] == MEMORY_NOTES["in-process"]
    # runs made two ways: both said, and what does not compare across them
    isolation, memory = run_notes([{"isolation": "spawn", "jobs": 2}, {"isolation": "in-process", "jobs": 1}] * 2, {})
    assert isolation.startswith("MIXED (in-process (2 runs); one fresh process per run (spawn), 2 at a time (2 runs))")
    assert memory.startswith("MIXED") and MEMORY_NOTES["spawn"] in memory and "not comparable" in memory
    # results of an older sweep, without the record: the notes stored with it
    assert run_notes([{"name": "x"}], {"settings": {"isolation": "spawn"}, "memory_note": "m"}) == ("spawn", "m")
    # an older sweep started in-process, resumed by this version in fresh processes: both ways, not only the last
    isolation, memory = run_notes([{"name": "x"}, {"isolation": "spawn", "jobs": 1}],
                                  {"settings": {"isolation": "in-process", "jobs": 1}, "memory_note": "m"})
    assert isolation.startswith("MIXED (in-process (1 run); one fresh process per run (spawn) (1 run))")
    assert memory.startswith("MIXED")


def test_failed_configs_are_reported_and_the_others_still_run(tmp_path, capsys, boom):
    config = tmp_path / "compare.yaml"
    config.write_text(
        "num_training_steps: 4\n"
        "configs:\n"
        "  - {name: bad lr, optimizer: {type: AdamW, lr: -1}}\n"
        "  - {name: no such, type: NoSuchOptimizer}\n"
        f"  - {{name: raises, type: {boom}, lr: 0.1}}\n"
        "  - {name: diverges, type: SGD, lr: 1.0e+6}\n"
        "  - {name: good, optimizer: {type: AdamW, lr: 1.0e-2}, lr_scheduler: {type: cosine, warmup_steps: 1}}\n"
    )
    out = tmp_path / "out"
    assert main(["compare", "--config", str(config), "--out", str(out), "--in-process", "--quiet"]) == 0
    printed = capsys.readouterr().out
    results = {r["name"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    assert results["bad lr"]["status"] == "failed" and "lr" in results["bad lr"]["error"]
    assert results["no such"]["status"] == "failed" and "NoSuchOptimizer" in results["no such"]["error"]
    assert results["raises"]["status"] == "failed" and "step 2" in results["raises"]["error"]
    assert "kaboom" in results["raises"]["error"] and len(results["raises"]["losses"]) == 1
    assert results["diverges"]["status"] == "diverged" and results["diverges"]["final"] is None
    assert results["good"]["status"] == "ok" and len(results["good"]["losses"]) == 4
    assert "kaboom" in printed and "failed" in printed
    assert (out / "loss_curves.png").exists()


def test_fp16_wrapper_reports_master_copy_and_skipped_steps():
    if not _installed("FP16Optimizer"):
        pytest.skip("optcore-fp16 is not installed")
    result = _run({"type": "AdamW", "lr": 1e-2, "precision": "fp16", "loss_scaler": {"init_scale": 2**24}}, steps=8)
    assert result["status"] == "ok", result["error"]
    # 2**24 is not representable in fp16: the scaler starts at the largest scale that is, and says so
    assert result["skipped_steps"] is not None and result["loss_scale"] <= 2**15
    assert any("not representable in torch.float16" in w for w in result["warnings"])
    n = result["n_params"]
    assert result["master_bytes"] == 8 * n  # fp32 master params and their grads
    assert 16 * n <= result["state_bytes"] < 16 * n + 64  # + AdamW's two fp32 moments (and step counters)


def test_closure_optimizers_and_schedulers_train():
    assert _run({"type": "LBFGS", "lr": 0.1, "max_iter": 2}, steps=2)["status"] == "ok"
    result = _run({"type": "SGD", "lr": 0.1}, steps=4, lr_scheduler={"type": "ReduceLROnPlateau", "patience": 1})
    assert result["status"] == "ok"


def test_names_get_the_line_up_hparams_and_unknown_ones_are_kept():
    entries = {e["name"]: e["optimizer"] for e in lineup.entries_from_names("adamw, torch:SGD ,NoSuch")}
    assert entries["adamw"] == {"type": "adamw", "lr": 1e-2, "weight_decay": 0.01}
    assert entries["torch:SGD"] == {"type": "torch:SGD", "lr": 0.3, "momentum": 0.9, "nesterov": True}
    assert entries["NoSuch"] == {"type": "NoSuch"}


@pytest.mark.parametrize("name", ["Lion", "Adafactor", "adamw"])
def test_a_plain_name_builds_what_resolve_and_build_optimizer_give(name):
    """One rule for a plain name everywhere: compare builds what optcore.resolve says
    (lion-pytorch for "Lion" where it shadows optcore-lion), and the table shows it."""
    if not _installed(name):
        pytest.skip(f"{name} is not installed")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = optcore.resolve(name)
        direct = optcore.build_optimizer({"type": name}, [torch.nn.Parameter(torch.zeros(2))])
    (entry,) = lineup.entries_from_names(name)
    assert lineup.built_name(entry["optimizer"]) == spec.qualified
    result = _run(entry["optimizer"], steps=1)
    assert result["built"] == spec.qualified and result["optimizer_class"] == type(direct).__name__


def test_the_line_up_names_qualified_implementations():
    for entry in lineup.default_entries():
        assert ":" in entry["optimizer"]["type"], entry


def test_default_line_up_is_installed_and_unique():
    entries = lineup.default_entries()
    names = [e["name"] for e in entries]
    assert {"AdamW", "Adam", "SGD", "RMSprop", "Adagrad"} <= set(names) and len(set(names)) == len(names)
    for entry in entries:
        optcore.resolve(entry["optimizer"]["type"])


def test_compare_file_forms_and_errors():
    entries, options = lineup.entries_from_file([{"type": "AdamW"}, "Lion", {"optimizer": {"type": "SGD"}}])
    assert [e["name"] for e in entries] == ["AdamW", "Lion", "SGD"] and options == {}
    with pytest.raises(optcore.ConfigError, match="non-empty list"):
        lineup.entries_from_file({"type": "AdamW"})
    with pytest.raises(optcore.ConfigError, match="num_training_steps"):
        lineup.entries_from_file([{"type": "AdamW", "num_training_steps": 3}])
    with pytest.raises(optcore.ConfigError, match="unknown keys"):
        lineup.entries_from_file([{"optimizer": {"type": "AdamW"}, "lr": 3}])


def test_examples_parse():
    entries, options = lineup.entries_from_file(load_config_file(EXAMPLES / "compare.yaml"))
    assert options == {"num_training_steps": 300, "seed": 0} and len(entries) >= 4
    assert all(e["name"] and e["optimizer"]["type"] for e in entries)
    from optcore.cli import check_config

    assert check_config(load_config_file(EXAMPLES / "run.yaml")) == []


def test_train_command(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(
        "optimizer: {type: AdamW, lr: 1.0e-2}\nlr_scheduler: {type: cosine, warmup_steps: 1}\nnum_training_steps: 50\n"
    )
    assert main(["train", "--config", str(run), "--steps", "4", "--sample", "12"]) == 0
    printed = capsys.readouterr().out
    assert "step     4/4  train loss" in printed and "final held-out loss" in printed and "sample:\nShall I " in printed
    bad = tmp_path / "bad.yaml"
    bad.write_text("optimizer: {type: AdamW, lr: -1}\n")
    assert main(["train", "--config", str(bad), "--steps", "2"]) == 1
    assert "lr" in capsys.readouterr().err


def test_importing_the_commands_is_cheap():
    code = (
        "import sys, optcore.cli; optcore.cli.build_parser(); "
        "print(sorted({'torch', 'rich', 'matplotlib', 'transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_compare_help_names_every_default_config_and_its_implementations(monkeypatch):
    """The epilog is made from lineup.DEFAULTS, so it names what `optcore compare`
    (and `scripts/dev demo`) runs by default, Muon+AdamW included."""
    from optcore.cli import build_parser

    monkeypatch.setenv("COLUMNS", "100")
    compare = build_parser()._subparsers._group_actions[0].choices["compare"]
    epilog = compare.format_help().split("Default line-up", 1)[1]
    flat = " ".join(epilog.split()).replace("- ", "-")  # argparse wraps lines, and breaks after hyphens
    for label, candidates, _, _ in lineup.DEFAULTS:
        assert f"{label} (" in flat, label
        assert all(name in flat for name in candidates), (label, candidates)
    assert {e["name"] for e in lineup.default_entries()} <= {label for label, *_ in lineup.DEFAULTS}
    assert "Muon+AdamW (torch:Muon; the rest: torch:AdamW)" in flat
