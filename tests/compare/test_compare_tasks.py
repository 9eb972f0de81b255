"""``optcore compare --task``: the protocol, the built-in tasks and a user's task file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import optcore
from optcore.cli import main
from optcore.compare.runner import run_one
from optcore.compare.tasks import BUILTIN, load_task
from optcore.compare.train import RunSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(task: str, steps: int = 3, **config) -> dict:
    entry = {"name": "x", "optimizer": {"type": "AdamW", "lr": 3e-3, **config}}
    return run_one(entry, RunSettings(steps=steps, task=task), isolate=False)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_tasks_train_and_are_reproducible(name):
    if name == "hf-llama":
        pytest.importorskip("transformers")
    task = load_task(name)
    assert task.name == name and task.describe()
    first, again = _run(name), _run(name)
    assert first["status"] == "ok", first["error"]
    assert len(first["losses"]) == 3 and first["final"] is not None and first["n_params"] > 1000
    assert first["losses"] == again["losses"] and first["val_losses"] == again["val_losses"]
    assert first["state_bytes_per_param"] == pytest.approx(8.0, abs=0.05)  # AdamW's two fp32 moments


def test_hf_llama_task_is_a_transformers_model():
    pytest.importorskip("transformers")
    import transformers

    model = load_task("hf-llama").model()
    assert isinstance(model.inner, transformers.LlamaForCausalLM)
    assert model.inner.config.num_hidden_layers == 2


def test_user_task_file_runs_through_the_cli(tmp_path):
    out = tmp_path / "out"
    rc = main(["compare", "--task", f"{EXAMPLES / 'my_task.py'}:task", "--optimizers", "AdamW,torch:SGD",
               "--steps", "5", "--in-process", "--quiet", "--out", str(out)])  # fmt: skip
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["task"]["name"] == "mlp-regression" and doc["task"]["spec"].endswith("my_task.py:task")
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]
    assert all(len(r["losses"]) == 5 for r in doc["results"])


def test_a_worker_that_joins_with_only_its_task_scores_the_stored_task_by_its_target(tmp_path, capsys):
    """--target and --task alone, joining a sweep of a user's task: --task names the
    code this worker runs (without it the join is refused, tests/compare/test_compare_storage.py),
    and joins the sweep as it is; the target is for that task, and the scores use it."""
    url, spec = f"sqlite:///{tmp_path / 's.db'}", f"{EXAMPLES / 'my_task.py'}:task"
    common = ["--storage", url, "--study", "s", "--in-process", "--quiet"]
    assert main(["compare", "--task", spec, "--optimizers", "AdamW", "--steps", "3", *common,
                 "--out", str(tmp_path / "first")]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["compare", *common, "--task", spec, "--target", "0.5", "--out", str(tmp_path / "join")]) == 0
    assert "scores by its own --target 0.5" in " ".join(capsys.readouterr().out.split())
    doc = json.loads((tmp_path / "join" / "results.json").read_text())
    assert doc["scores"]["targets"] == {spec: {"loss": 0.5, "source": "given", "set_by": None}}


def test_user_task_in_a_fresh_process(monkeypatch):
    """The spawned worker loads the task again from its spec."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    entry = {"name": "x", "optimizer": {"type": "AdamW", "lr": 1e-2}}
    settings = RunSettings(steps=2, task="my_task:task")
    isolated = run_one(entry, settings, isolate=True)
    here = run_one(entry, settings, isolate=False)
    assert isolated["status"] == "ok", isolated["error"]
    assert isolated["losses"] == here["losses"]


@pytest.mark.parametrize(
    ("spec", "match"),
    [("nonsense", "neither a built-in"), ("no_such_module_xyz:task", "cannot import"),
     ("optcore.compare.tasks:NOPE", "has no 'NOPE'"), ("optcore:__version__", "not a task")],
)  # fmt: skip
def test_bad_task_specs_say_what_to_do(spec, match):
    with pytest.raises(optcore.ConfigError, match=match):
        load_task(spec)
