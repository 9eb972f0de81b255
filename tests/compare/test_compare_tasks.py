"""``optcore compare --task``: the protocol, the built-in tasks and a user's task file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


NCTASK = """
import torch


class Task:
    name = "nc-task"

    def describe(self):
        return "a linear regression beside the command"

    def model(self):
        return torch.nn.Linear(4, 1)

    def batches(self, seed):
        g = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(8, 4, generator=g)
            yield x, x.sum(1, keepdim=True)

    def heldout(self, seed):
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(8, 4, generator=g)
        return [(x, x.sum(1, keepdim=True))]

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)


task = Task
"""


def _console_script(folder: Path, task_folder: Path) -> Path:
    """A launcher like the ``optcore`` script pip writes: its own folder, not the
    current one, starts ``sys.path``; this test process's import folders follow
    (so that it runs this checkout's optcore), none of them the task's folder."""
    folder.mkdir()
    paths = [os.path.abspath(p) for p in sys.path if p and Path(p).resolve() != task_folder.resolve()]
    script = folder / "optcore"
    script.write_text(f"import sys\nsys.path[1:1] = {paths!r}\nfrom optcore.cli import main\n"
                      "if __name__ == '__main__':\n    sys.exit(main())\n")  # a spawned worker imports it too
    return script


def test_a_task_package_in_the_current_folder_resolves_as_python_m_finds_it(tmp_path):
    """`optcore compare --task nctask.tasks:task` run in the folder that holds
    ``nctask/``, without PYTHONPATH: the script's sys.path does not hold that folder,
    and the task is found there as ``python -m`` would find it."""
    work = tmp_path / "work"
    (work / "nctask").mkdir(parents=True)
    (work / "nctask" / "__init__.py").write_text("")
    (work / "nctask" / "tasks.py").write_text(NCTASK)
    script = _console_script(tmp_path / "bin", work)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(script), "compare", "--task", "nctask.tasks:task", "--optimizers", "AdamW",
         "--steps", "3", "--quiet", "--out", str(tmp_path / "out")],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["task"]["name"] == "nc-task" and doc["task"]["spec"] == "nctask.tasks:task"
    assert [r["status"] for r in doc["results"]] == ["ok"]  # in a spawned worker, which finds it the same way


def test_the_current_folder_is_on_sys_path_only_for_the_tasks_import(tmp_path, monkeypatch):
    """The folder is searched after the installed packages, for the import of the
    task the user named, and is off ``sys.path`` again afterwards: a module path read
    from storage or a config is resolved without it."""
    (tmp_path / "nctask_here").mkdir()
    (tmp_path / "nctask_here" / "__init__.py").write_text(NCTASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and Path(p).resolve() != tmp_path.resolve()])
    monkeypatch.delitem(sys.modules, "nctask_here", raising=False)
    before = list(sys.path)
    assert load_task("nctask_here:task").name == "nc-task"
    assert sys.path == before
    sys.modules.pop("nctask_here", None)
    with pytest.raises(optcore.ConfigError, match="current folder"):
        load_task("nctask_elsewhere:task")


@pytest.mark.parametrize(
    ("spec", "match"),
    [("nonsense", "neither a built-in"), ("no_such_module_xyz:task", "cannot import"),
     ("optcore.compare.tasks:NOPE", "has no 'NOPE'"), ("optcore:__version__", "not a task")],
)  # fmt: skip
def test_bad_task_specs_say_what_to_do(spec, match):
    with pytest.raises(optcore.ConfigError, match=match):
        load_task(spec)
