"""A shared Optuna storage is input from others: a joining worker runs only code it
names itself, and ``compare report`` skips bad stored records by name, shows stored
text as text, and refuses oversized records quickly (issue 40)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import optcore
from optcore.cli import main
from optcore.compare.tasks import load_task
from optcore.compare.train import empty_result

optuna = pytest.importorskip("optuna")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROOT = Path(__file__).resolve().parents[2]
ENTRY = {"name": "AdamW", "optimizer": {"type": "torch:AdamW", "lr": 0.01}}
PROTOCOL = {"trials": 0, "studies": 1, "sampler": "sobol", "sampler_seed": 0, "tuning_seed": 0, "prune": False}


def _meta(task: str = "char-lm", entries: list | None = None) -> dict:
    from optcore.compare.study import sweep_meta

    return sweep_meta(entries or [ENTRY], {}, task={"spec": task, "name": "t", "description": "d"}, steps=2, seeds=[0],
                      lr_sweep=None, lrs=None, protocol=PROTOCOL,
                      extra={"summary": "crafted", "memory_note": "m", "loss_label": "loss", "settings": {},
                             "target": None})  # fmt: skip


def _result(name: str = "AdamW", **changes) -> dict:
    result = {**empty_result(ENTRY), "name": name, "seed": 0, "lr": 0.01, "final": 2.0, "best": 1.9, "best_step": 2,
              "losses": [3.0, 2.5], "val_losses": [[0, 3.0], [2, 2.0]], "eval_seconds": [0.0, 0.1]}  # fmt: skip
    return {**result, **changes}


def _craft(url: str, meta: dict | None = None, trials: list | None = None, study: str = "s") -> None:
    """A sweep as a worker with write access to the database could leave it: ``trials`` are
    ``(attrs, result or None)``; a trial with a result is finished."""
    from optcore.compare.study import open_storage

    storage = open_storage(url)
    index = optuna.create_study(study_name=study, storage=storage)
    index.set_user_attr("optcore", meta if meta is not None else _meta())
    default = {"phase": "defaults", "config": "AdamW", "slot": 0, "seed": 0, "lr": 0.01, "entry": ENTRY}
    for attrs, result in trials if trials is not None else [(default, None)]:
        index.enqueue_trial({}, user_attrs={"optcore": attrs})
        if result is not None:
            trial = index.get_trials(deepcopy=False)[-1]
            storage.set_trial_user_attr(trial._trial_id, "result", result)
            storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.RUNNING)
            index.tell(trial.number, 2.0)
    index.set_user_attr("ready", True)


def _join(url: str, out: Path, *extra: str) -> int:
    return main(["compare", "--storage", url, "--study", "s", "--in-process", "--quiet", "--out", str(out), *extra])


def _marker_module(folder: Path, name: str, body: str = "") -> Path:
    """A module that leaves ``folder/<name>.ran`` when its code runs."""
    marker = folder / f"{name}.ran"
    (folder / f"{name}.py").write_text(f"{body}\nfrom pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    return marker


# ------------------------------------------------------------ code named by the storage
def test_a_stored_task_file_is_not_imported_on_join(tmp_path, capsys):
    marker = _marker_module(tmp_path, "evil_task", (EXAMPLES / "my_task.py").read_text())
    url, spec = f"sqlite:///{tmp_path / 's.db'}", f"{tmp_path / 'evil_task.py'}:task"
    _craft(url, _meta(task=spec))
    assert _join(url, tmp_path / "join") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "user code" in err and spec in err and f"--study s --task {spec}" in err
    assert not marker.exists()


def test_a_worker_whose_own_task_names_the_stored_spec_joins(tmp_path):
    marker = _marker_module(tmp_path, "own_task", (EXAMPLES / "my_task.py").read_text())
    url, spec = f"sqlite:///{tmp_path / 's.db'}", f"{tmp_path / 'own_task.py'}:task"
    _craft(url, _meta(task=spec))
    assert _join(url, tmp_path / "join", "--task", spec) == 0
    assert marker.exists()  # it ran: this worker named it
    assert json.loads((tmp_path / "join" / "results.json").read_text())["results"][0]["status"] == "ok"


def _cli(tmp_path: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    paths = [str(ROOT), *(str(p) for p in sorted((ROOT / "plugins").glob("*/src"))), str(tmp_path)]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(env or {})}
    return subprocess.run([sys.executable, "-m", "optcore.cli", *argv], capture_output=True, text=True, timeout=240,
                          check=False, env=environ, cwd=tmp_path)  # fmt: skip


def test_a_stored_task_or_task_index_naming_os_abort_does_not_abort(tmp_path):
    """In the main process under --in-process, where os.abort would end the worker with SIGABRT (rc 134)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    _craft(url, _meta(task="os:abort"))
    from optcore.compare.study import open_storage

    index = optuna.create_study(study_name="several", storage=open_storage(url))
    index.set_user_attr("optcore_tasks", ["char-lm", "os:abort"])
    for study in ("s", "several"):
        done = _cli(tmp_path, "compare", "--storage", url, "--study", study, "--in-process", "--quiet",
                    "--out", str(tmp_path / study))  # fmt: skip
        assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
        assert "'os:abort', which is user code" in done.stderr and "Traceback" not in done.stderr


def _evil_trial_storage(tmp_path: Path) -> tuple[str, Path, list[str]]:
    """A real sweep (one run done) and, waiting in it, a trial whose optimizer names a module
    that writes a marker on import; returns the URL, the marker and the command that made it."""
    marker = _marker_module(tmp_path, "evil_opt", "import torch\nclass Evil(torch.optim.SGD):\n    pass\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    command = ["--optimizers", "torch:SGD", "--steps", "1"]
    assert _join(url, tmp_path / "first", *command) == 0
    from optcore.compare.study import open_storage

    study = optuna.load_study(study_name="s", storage=open_storage(url))
    entry = {"name": "torch:SGD", "optimizer": {"type": "evil_opt:Evil", "lr": 0.1}}
    study.enqueue_trial({}, user_attrs={"optcore": {"phase": "defaults", "config": "torch:SGD", "slot": 5, "seed": 0,
                                                    "lr": 0.1, "entry": entry}})  # fmt: skip
    return url, marker, command


def test_a_waiting_trial_naming_a_module_is_refused_on_join_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    url, marker, command = _evil_trial_storage(tmp_path)
    capsys.readouterr()
    for extra in ([], command):  # join as it is; resume with the command that started it
        assert _join(url, tmp_path / "again", *extra) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert "'evil_opt:Evil'" in err and ", trial 1" in err and "runs only code it names itself" in err
    assert not marker.exists() and "evil_opt" not in sys.modules
    # the same refusal in a fresh process, where nothing of the test is imported
    done = _cli(tmp_path, "compare", "--storage", url, "--study", "s", "--in-process", "--quiet", "--out", "x")
    assert done.returncode == 1 and "'evil_opt:Evil'" in done.stderr and not marker.exists()


def test_a_stored_config_naming_a_module_is_refused_and_one_the_worker_names_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = _marker_module(tmp_path, "evil_cfg", "import torch\nclass Evil(torch.optim.SGD):\n    pass\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    entry = {"name": "Evil", "optimizer": {"type": "evil_cfg:Evil", "lr": 0.1},
             "lr_scheduler": {"type": "evil_cfg:Sched"}}  # fmt: skip
    attrs = {"phase": "defaults", "config": "Evil", "slot": 0, "seed": 0, "lr": 0.1, "entry": entry}
    _craft(url, _meta(entries=[entry]), [(attrs, None)])
    assert _join(url, tmp_path / "join") == 1
    assert "'evil_cfg:Evil' (config 'Evil')" in " ".join(capsys.readouterr().err.split())
    assert not marker.exists()
    from optcore.compare.trust import Trust

    Trust.of(None, [entry], "x").check_entry("s", entry)  # named by the worker itself: taken
    with pytest.raises(optcore.ConfigError, match="scheduler type 'evil_cfg:Sched'"):
        Trust.of(None, [ENTRY | {"optimizer": entry["optimizer"]}], "x").check_entry("s", entry)


def test_builtin_and_installed_names_are_taken_from_the_storage():
    from optcore.compare.trust import Trust, imports_nothing_foreign

    for kind, name in [("optimizer", "AdamW"), ("optimizer", "torch:AdamW"), ("optimizer", "torch.optim.SGD"),
                       ("optimizer", "optcore-lion:Lion"), ("optimizer", "NoSuchName"), ("scheduler", "cosine")]:
        assert imports_nothing_foreign(kind, name), name
    for name in ("os:abort", "evil_xyz:Evil", "evil_xyz.Evil", "x" * 300, "\x1b[2J"):
        assert not imports_nothing_foreign("optimizer", name), name
    Trust.of(None, [], "x").check_tasks("s", ["char-lm", "vision", "hf-llama"])


def test_import_paths_turned_off_stop_task_paths(tmp_path, monkeypatch):
    marker = _marker_module(tmp_path, "off_task", (EXAMPLES / "my_task.py").read_text())
    monkeypatch.setenv("OPTCORE_ALLOW_IMPORT_PATHS", "0")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in (f"{tmp_path / 'off_task.py'}:task", "off_task:task", "os:abort"):
        with pytest.raises(optcore.ConfigError, match="import paths are turned off"):
            load_task(spec)
    assert not marker.exists()
    assert load_task("char-lm").name == "char-lm"


# ------------------------------------------------------------ bad records in a report
def _report(url: str, out: Path) -> int:
    return main(["compare", "report", "--storage", url, "--study", "s", "--out", str(out)])


def test_a_report_skips_bad_trials_by_name_and_shows_the_rest(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 's.db'}"
    good = {"phase": "defaults", "config": "AdamW", "slot": 0, "seed": 0, "lr": 0.01, "entry": ENTRY}
    _craft(url, trials=[
        (good, _result()),
        ({**good, "slot": 1}, {k: v for k, v in _result().items() if k != "status"}),  # KeyError 'status' before
        ({k: v for k, v in good.items() if k != "slot"}, _result()),  # KeyError 'slot'
        ({**good, "slot": 2, "phase": "warmup"}, _result()),  # an unknown phase
        ({**good, "slot": 3}, _result(final="2.0")),  # TypeError
        ({**good, "slot": 4, "config": "[bold]x[/"}, _result()),  # not a config of the sweep
        ({**good, "slot": 6}, _result(name="\x1b[2Jboom")),  # an escape sequence
        ({**good, "slot": 7}, _result()),
    ])  # fmt: skip
    with sqlite3.connect(tmp_path / "s.db") as db:  # a result that is not JSON, written around Optuna
        db.execute("UPDATE trial_user_attributes SET value_json = '{bad' WHERE key = 'result' AND trial_id = "
                   "(SELECT trial_id FROM trials WHERE number = 7)")  # fmt: skip
    assert _report(url, tmp_path / "r") == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("Skipped:")]
    assert len(skipped) == 6, out
    assert "study 's', trial 1, key 'result'" in out and "status: Field required" in out
    assert "trial 2, key 'optcore'): slot: Field required" in out and "trial 3, key 'optcore'): phase:" in out
    assert "trial 5, key 'optcore'): config '[bold]x[/' is not one of the sweep's" in out
    assert "trial 7, key 'attributes'): not JSON" in out and "trial 6, key 'result'): name:" in out
    assert "\x1b" not in out
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    assert [r["name"] for r in doc["results"]] == ["AdamW", "AdamW"]  # the good trial and the one with a str final


def test_stored_text_is_shown_as_text(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 's.db'}"
    name = "[bold]x[/"
    entry = {"name": name, "optimizer": {"type": "torch:AdamW", "lr": 0.01}}
    attrs = {"phase": "defaults", "config": name, "slot": 0, "seed": 0, "lr": 0.01, "entry": entry}
    failed = _result(name, status="failed", final=None, error="step 1: \x1b[2J[red]gone[/red] $\\frac$",
                     warnings=["[link=x]w\x1b[0m"])  # fmt: skip
    _craft(url, _meta(entries=[entry]) | {"summary": "[/]\x1b]0;title\x07"}, [(attrs, failed)])
    assert _report(url, tmp_path / "r") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "[bold]x[/" in out and "[red]gone[/red]" in out and "\\x1b[2J" in out


def test_a_five_megabyte_name_is_refused_in_seconds(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 's.db'}"
    huge = "L" * 5_000_000
    entry = {"name": "AdamW", "optimizer": {"type": huge, "lr": 0.01}}
    good = {"phase": "defaults", "config": "AdamW", "slot": 0, "seed": 0, "lr": 0.01, "entry": ENTRY}
    _craft(url, trials=[(good, _result()), ({**good, "slot": 1}, _result(name=huge, built=huge))])
    begin = time.perf_counter()
    assert _report(url, tmp_path / "r") == 0
    assert "trial 1, key 'result'" in capsys.readouterr().out
    _craft(url, _meta(entries=[entry]), study="t")
    assert main(["compare", "report", "--storage", url, "--study", "t", "--out", str(tmp_path / "t")]) == 1
    assert "5,000,000 characters" in capsys.readouterr().err
    assert time.perf_counter() - begin < 10  # 142 s before


def test_a_bad_sweep_record_is_named(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _craft(url, {k: v for k, v in _meta().items() if k != "entries"})
    assert _report(url, tmp_path / "r") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "Bad stored record (study 's', key 'optcore'): entries: Field required" in err


def test_a_bad_results_file_is_named(tmp_path):
    from optcore.compare import records

    path = tmp_path / "results.json"
    for text in ("{bad", json.dumps({"rows": [{"name": "x", "status": "ok", "runs": [3]}], "results": []})):
        path.write_text(text)
        with pytest.raises(optcore.ConfigError, match="results.json"):
            records.read_results(path)
