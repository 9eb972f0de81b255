"""A finished compare study as optuna-dashboard shows it: each trial's optimizer,
hyper-parameters, learning curve and result under readable names
(optcore/compare/dashboard.py), read from a real optuna-dashboard server's JSON API."""

from __future__ import annotations

import json
import math
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from optcore.cli import main
from optcore.compare import dashboard

optuna = pytest.importorskip("optuna")

NAMES = ("AdamW", "torch:SGD")
STEPS = 8


# ------------------------------------------------------------ what a trial shows
def test_hyperparameters_are_the_numbers_the_config_sets_by_readable_names():
    entry = {"name": "AdamW", "optimizer": {"type": "torch:AdamW", "lr": 3e-3, "betas": [0.9, 0.95], "amsgrad": True},
             "lr_scheduler": {"type": "cosine", "warmup_steps": 10}}  # fmt: skip
    assert dashboard.hyperparameters(entry) == {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95,
                                                "lr_scheduler.warmup_steps": 10.0}  # fmt: skip
    composite = {"name": "Muon+AdamW", "optimizer": {"type": "Muon", "lr": 0.02,
                                                     "fallback": {"type": "AdamW", "lr": 3e-4, "weight_decay": 0.1}}}
    assert dashboard.hyperparameters(composite) == {"lr": 0.02, "fallback.lr": 3e-4, "fallback.weight_decay": 0.1}


def test_a_wrappers_inner_optimizer_holds_the_plain_names():
    entry = {"name": "w", "optimizer": {"type": "fp16", "loss_scale": 1024, "optimizer": {"type": "AdamW", "lr": 1e-3}}}
    assert dashboard.hyperparameters(entry) == {"lr": 1e-3, "loss_scale": 1024.0}


def test_a_config_without_an_lr_shows_the_lr_its_optimizer_takes_by_default():
    assert dashboard.hyperparameters({"name": "SGD", "optimizer": {"type": "torch:SGD"}})["lr"] == pytest.approx(1e-3)


def test_params_show_the_optimizer_over_the_studys_configs():
    entry = {"name": "B", "optimizer": {"type": "torch:SGD", "lr": 0.1, "momentum": 0.9}}
    shown = {name: (value, dist) for name, value, dist in dashboard.params(entry, "B", ["A", "B"], taken=["momentum"])}
    assert set(shown) == {"optimizer", "lr"}
    value, dist = shown["optimizer"]
    assert dist.choices == ("A", "B") and dist.to_external_repr(value) == "B"
    assert shown["lr"][1].low == shown["lr"][1].high == 0.1


def test_the_curve_is_the_mean_of_the_last_steps_at_evenly_spaced_steps():
    losses = [float(i) for i in range(1, 201)]  # step s has loss s
    points = dashboard.curve(losses, 200)
    assert [s for s, _ in points] == list(range(4, 201, 4))
    assert dict(points)[8] == pytest.approx(sum(range(4, 9)) / 5)
    diverged = dashboard.curve([3.0, 2.0, None], 200)  # stopped at step 3 (a non-finite loss is None)
    assert diverged == [(3, 2.5)]
    assert dashboard.curve([], 10) == [] and dashboard.curve([None], 10) == []


def test_result_attrs_name_the_outcome_and_escape_the_error():
    result = {"status": "failed", "error": "build: \x1b[2J" + "x" * 5000, "best": None, "best_step": None,
              "steps_per_s": 12.5}  # fmt: skip
    shown = dashboard.result_attrs(result)
    assert shown["status"] == "failed" and shown["steps per second"] == 12.5 and "best held-out loss" not in shown
    assert "\x1b" not in shown["error"] and len(shown["error"]) < dashboard.MAX_SHOWN + 30


def _one_trial(tmp_path):
    from optcore.compare.study import Claimed, Sweep

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    sweep = Sweep(storage, "s", {"entries": [], "protocol": {}, "steps": 100})
    attrs = {"phase": "tune", "config": "A", "slot": 0, "seed": 0}
    return sweep, Claimed(study, trial._trial_id, trial.number, attrs, {}, trial), storage


def test_the_curve_keeps_what_the_pruner_was_told_and_ends_where_the_run_was_pruned(tmp_path):
    sweep, claimed, storage = _one_trial(tmp_path)
    claimed.trial.report(99.0, 10)  # what --prune reported while the run ran
    losses = [1.0] * 30
    sweep._show_result(claimed, {"status": "pruned", "pruned_at": 20, "losses": losses, "error": None})
    curve = storage.get_trial(claimed.trial_id).intermediate_values
    assert curve[10] == 99.0 and max(curve) == 20 and curve[2] == 1.0
    assert storage.get_trial(claimed.trial_id).user_attrs["status"] == "pruned"


def test_a_run_of_many_steps_writes_about_curve_points_values(tmp_path):
    sweep, claimed, storage = _one_trial(tmp_path)
    sweep.meta["steps"] = 10_000
    sweep._show_result(claimed, {"status": "ok", "losses": [2.0] * 10_000, "best": 1.5, "best_step": 9000})
    curve = storage.get_trial(claimed.trial_id).intermediate_values
    assert len(curve) == dashboard.CURVE_POINTS and max(curve) == 10_000
    assert storage.get_trial(claimed.trial_id).user_attrs["best held-out loss"] == 1.5


# ------------------------------------------------------------ a finished study in optuna-dashboard
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("dash") / "out"
    rc = main(["compare", "--optimizers", ",".join(NAMES), "--steps", str(STEPS), "--seeds", "1", "--trials", "1",
               "--in-process", "--quiet", "--out", str(out)])  # fmt: skip
    assert rc == 0
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dashboard_command() -> list[str]:
    script = Path(sys.executable).with_name("optuna-dashboard")
    found = str(script) if script.exists() else shutil.which("optuna-dashboard")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from optuna_dashboard._cli import main; sys.exit(main())"]


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def api(finished):
    """GET of the JSON API of optuna-dashboard serving the finished study; the server is killed afterwards."""
    pytest.importorskip("optuna_dashboard")
    port = _free_port()
    url = f"sqlite:///{(finished / 'optuna.db').resolve()}"
    log = (finished / "dashboard.log").open("wb")
    server = subprocess.Popen([*_dashboard_command(), url, "--host", "127.0.0.1", "--port", str(port),
                               "--server", "wsgiref"], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _get(port, "/api/studies")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"optuna-dashboard did not serve: {(finished / 'dashboard.log').read_text()[-2000:]}")
                time.sleep(0.3)
        yield lambda path: _get(port, path)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _studies(api) -> dict[str, dict]:
    listed = {s["study_name"]: s["study_id"] for s in api("/api/studies")["study_summaries"]}
    return {name: api(f"/api/studies/{sid}") for name, sid in listed.items()}


def _attrs(trial: dict) -> dict[str, str]:
    return {a["key"]: a["value"] for a in trial["user_attrs"]}


def _params(trial: dict) -> dict[str, str]:
    return {p["name"]: p["param_external_value"] for p in trial["params"]}


def test_every_study_of_the_sweep_is_listed_with_its_objectives_name(api):
    studies = _studies(api)
    assert set(studies) == {"compare", *(f"compare/{n}/tune-0" for n in NAMES), *(f"compare/{n}/seeds" for n in NAMES)}
    for name, study in studies.items():
        assert study["objective_names"] == ["final held-out cross-entropy (nats/char)"], name
        assert "training loss" in {a["key"]: a["value"] for a in study["user_attrs"]}["learning curve"]


def test_each_trial_shows_its_optimizer_hyperparameters_curve_and_result(api, finished):
    studies = _studies(api)
    results = json.loads((finished / "results.json").read_text())
    runs = {(r["name"], r["phase"]): r for r in results["results"] + results["tuned"]["results"]}
    seen = set()
    for name, study in studies.items():
        assert study["trials"], name
        assert study["has_intermediate_values"], name
        for trial in study["trials"]:
            attrs, params = _attrs(trial), _params(trial)
            optimizer = attrs["optimizer"]
            assert optimizer in NAMES and params["optimizer"] == optimizer, (name, trial["number"])
            seen.add(optimizer)
            assert attrs["phase"] == json.loads(_raw(trial))["phase"]
            assert float(params["lr"]) > 0 and json.loads(attrs["optimizer config"])["lr"] == float(params["lr"])
            if optimizer == "torch:SGD":
                assert float(params["momentum"]) > 0
            curve = trial["intermediate_values"]
            assert all(isinstance(v["value"], float) and math.isfinite(v["value"]) for v in curve)
            if attrs["status"] == "diverged":  # a tuning point can be too large: shown failed, with its error
                assert attrs["phase"] == "tune" and trial["state"] == "Fail" and "nan" in attrs["error"]
                assert curve and "values" not in trial
                continue
            assert attrs["status"] == "ok" and trial["state"] == "Complete", (name, trial["number"], attrs)
            assert [v["step"] for v in curve] == list(range(1, STEPS + 1)), (name, trial["number"])
            (value,) = trial["values"]
            if attrs["phase"] != "tune":
                run = runs[(optimizer, attrs["phase"])]
                assert value == pytest.approx(run["final"])
                assert [(v["step"], pytest.approx(v["value"])) for v in curve] == dashboard.curve(run["losses"], STEPS)
            assert float(attrs["best held-out loss"]) <= value + 1e-12
    assert seen == set(NAMES)


def test_tuning_trials_show_the_searched_space_as_params(api):
    study = _studies(api)["compare/AdamW/tune-0"]
    (trial,) = study["trials"]
    params = {p["name"]: p for p in trial["params"]}
    assert {"lr", "weight_decay", "beta1", "beta2", "warmup", "optimizer"} <= set(params)
    assert params["lr"]["distribution"]["log"] and params["lr"]["distribution"]["low"] < params["lr"]["distribution"]["high"]
    searched = {p["name"] for p in study["union_search_space"]}
    assert {"lr", "weight_decay", "beta1", "beta2", "warmup"} <= searched


def _raw(trial: dict) -> str:
    return _attrs(trial)["optcore"]


def test_the_readable_names_are_never_read_back(finished, tmp_path, capsys):
    """What the dashboard shows is written for people: tampering with it changes nothing optcore reports."""
    copy = tmp_path / "out"
    shutil.copytree(finished, copy)
    readable = ("optimizer", "phase", "seed", "status", "optimizer config", "best held-out loss", "error")
    bad = json.dumps("\x1b[2J[bold]" + "x" * 100_000)
    with sqlite3.connect(copy / "optuna.db") as db:  # around Optuna, which keeps a finished trial's attributes
        db.execute("UPDATE study_user_attributes SET value_json = ? WHERE key = 'learning curve'", (bad,))
        trials = [row[0] for row in db.execute("SELECT trial_id FROM trials")]
        for trial_id in trials:
            for key in readable:
                db.execute("DELETE FROM trial_user_attributes WHERE trial_id = ? AND key = ?", (trial_id, key))
                db.execute("INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
                           (trial_id, key, bad))  # fmt: skip
        db.execute("UPDATE trial_params SET param_value = 0 WHERE param_name = 'optimizer'")
        db.execute("UPDATE trial_intermediate_values SET intermediate_value = 1e300")
    before = json.loads((finished / "results.json").read_text())
    assert main(["compare", "report", "--storage", f"sqlite:///{copy / 'optuna.db'}", "--out", str(copy)]) == 0
    after = json.loads((copy / "results.json").read_text())
    assert after["results"] == before["results"] and after["tuned"] == before["tuned"]
    assert "\x1b[2J" not in capsys.readouterr().out
