"""``optcore compare`` on Optuna: search spaces, equal tuning budgets, the storage,
workers sharing one sweep (SQLite and a real PostgreSQL server), the retry of a
killed worker's trial, and ``compare report`` from the storage alone."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import optcore
from optcore.cli import main
from optcore.compare import lineup, tuning

optuna = pytest.importorskip("optuna")

#: Keys of a results.json that describe the run that wrote it, not the comparison.
LIVE = {"settings", "complete", "interrupted", "cut", "elapsed_s", "optcore_version"}


def _compare(out: Path, *extra: str, names: str = "AdamW,torch:SGD", steps: int = 3) -> dict:
    rc = main(["compare", "--optimizers", names, "--steps", str(steps), "--in-process", "--quiet",
               "--out", str(out), *extra])  # fmt: skip
    assert rc == 0
    return json.loads((out / "results.json").read_text())


def _storage(url: str):
    from optcore.compare.study import open_storage

    return open_storage(url)


def _finished_slots(url: str, name: str) -> dict[str, list[int]]:
    """Per study of the sweep: the slots of its trials that ran to a result, one entry per run."""
    storage = _storage(url)
    out = {}
    for study_name in optuna.get_all_study_names(storage):
        if study_name == name or study_name.startswith(name + "/"):
            study = optuna.load_study(study_name=study_name, storage=storage)
            out[study_name] = sorted(t.user_attrs["optcore"]["slot"] for t in study.get_trials() if "result" in t.user_attrs)
    return out


# ------------------------------------------------------------ search spaces
def test_every_line_up_entry_declares_a_space_its_optimizer_takes():
    for entry in lineup.default_entries():
        space = lineup.search_space(entry)
        assert "lr" in space and space["lr"]["log"], entry["name"]
        point = {name: (dim["low"] * dim["high"]) ** 0.5 if dim["log"] else (dim["low"] + dim["high"]) / 2
                 for name, dim in space.items()}  # fmt: skip
        config = lineup.apply_point(entry, point, 100)
        import torch

        optcore.build(config, torch.nn.Linear(2, 2), num_training_steps=100)  # every point of the space builds


def test_a_point_sets_what_its_names_say():
    entry = {"name": "AdamW", "optimizer": {"type": "torch:AdamW", "lr": 1e-2}}
    config = lineup.apply_point(entry, {"lr": 3e-3, "weight_decay": 0.05, "beta2": 0.98, "warmup": 0.1}, 200)
    assert config["optimizer"] == {"type": "torch:AdamW", "lr": 3e-3, "weight_decay": 0.05, "betas": [0.9, 0.98]}
    assert config["lr_scheduler"] == {"type": "constant_with_warmup", "warmup_steps": 20}
    own = {**entry, "lr_scheduler": {"type": "cosine", "warmup_steps": 5}}
    assert lineup.apply_point(own, {"warmup": 0.05}, 200)["lr_scheduler"] == {"type": "cosine", "warmup_steps": 10}


def test_a_compare_file_overrides_the_space():
    entries, _ = lineup.entries_from_file([
        {"name": "mine", "optimizer": {"type": "torch:SGD", "lr": 0.1},
         "search_space": {"lr": [1e-3, 1.0], "momentum": {"low": 0.5, "high": 0.95}}},
        {"type": "torch:AdamW", "lr": 1e-3},
        {"type": "torch:Rprop", "lr": 1e-2},
    ])  # fmt: skip
    assert lineup.search_space(entries[0]) == {"lr": {"low": 1e-3, "high": 1.0, "log": True},
                                               "momentum": {"low": 0.5, "high": 0.95, "log": False}}  # fmt: skip
    assert lineup.search_space(entries[1])["weight_decay"]["high"] == 0.3  # the line-up's AdamW space
    assert lineup.search_space(entries[2]) == {"lr": {"low": 1e-2 / 30, "high": 1e-2 * 30, "log": True}}


@pytest.mark.parametrize(("space", "message"), [
    ({"lr": [1e-3]}, "a range is"), ({"lr": [0, 1]}, "low > 0 on a log scale"), ({"lr": [1, 0.1]}, "low < high"),
    ({"learning_rate": [1e-3, 1e-1]}, "unknown search-space name 'learning_rate'"), ({"warmup": [0, 2]}, "fraction"),
])  # fmt: skip
def test_bad_spaces_are_config_errors(space, message):
    with pytest.raises(optcore.ConfigError, match=message):
        lineup.parse_space(space)


def test_a_space_name_the_optimizer_does_not_take_is_refused():
    entry = lineup.normalise_entry({"type": "torch:Adagrad", "search_space": {"momentum": [0.5, 0.9]}})
    with pytest.raises(optcore.ConfigError, match="no momentum field"):
        lineup.search_space(entry)


# -------------------------------------------------------------- the budget
def test_points_are_the_seeded_quasi_random_sequence_inside_the_space():
    space = {"lr": {"low": 1e-4, "high": 1e-1, "log": True}, "beta1": {"low": 0.8, "high": 0.95, "log": False}}
    first, again, other = (tuning.draw_points(space, 8, seed) for seed in (0, 0, 1))
    assert first == again and first != other and len(first) == 8
    for point in first:
        assert 1e-4 <= point["lr"] <= 1e-1 and 0.8 <= point["beta1"] <= 0.95
    # a (0, m, 2)-net in base 2: every eighth of the unit square's first axis holds one of 8 Sobol points
    import math

    cells = sorted(int(8 * (math.log(p["lr"]) - math.log(1e-4)) / (math.log(1e-1) - math.log(1e-4))) for p in first)
    assert cells == list(range(8))
    halton = tuning.draw_points(space, 8, 0, "halton")
    assert halton != first


def test_the_score_is_the_median_of_the_studies_bests():
    def trial(number, final, status="ok", lr=1e-3):
        return {"number": number, "final": final, "status": status, "lr": lr, "point": {"lr": lr}, "slot": number}

    studies = [tuning.study_record(0, [trial(0, 2.5), trial(1, 2.1, lr=3e-3)]),
               tuning.study_record(1, [trial(2, 2.4), trial(3, None, "diverged", lr=0.5)]),
               tuning.study_record(2, [trial(4, 2.0, lr=1e-2), trial(5, 2.2)])]  # fmt: skip
    assert [s["best"] for s in studies] == [2.1, 2.4, 2.0] and studies[1]["diverged"] == 1
    chosen = tuning.choose(studies)
    assert chosen["score"] == 2.1 == statistics.median([2.1, 2.4, 2.0]) and chosen["lr"] == 3e-3
    assert tuning.median_best([2.0, 3.0]) == 2.0  # even count: the lower median, a run that happened
    region = tuning.unstable_region([t for s in studies for t in s["trials"]])
    assert region == {"diverged_lrs": [0.5], "largest_ok_lr": 1e-2, "from_lr": 0.5}
    assert "unstable from lr 0.5" in tuning.describe_unstable("x", region)


def test_tuned_protocol_end_to_end_and_report_from_storage(tmp_path, capsys):
    out = tmp_path / "live"
    doc = _compare(out, "--trials", "2", "--studies", "2", "--seeds", "1,2", "--target", "4.0")
    printed = capsys.readouterr().out
    assert doc["scores"]["targets"] and all(t["source"] == "given" for t in doc["scores"]["targets"].values())
    assert "at defaults and tuned with 2 trials x 2 studies" in printed and "re-seeded" in printed
    tuned = doc["tuned"]
    assert doc["protocol"]["trials"] == 2 and doc["protocol"]["studies"] == 2 and doc["protocol"]["seeds"] == [1, 2]
    for name in ("AdamW", "torch:SGD"):
        record = tuned["optimizers"][name]
        assert [len(s["trials"]) for s in record["studies"]] == [2, 2]
        bests = [s["best"] for s in record["studies"]]
        assert record["score"] == statistics.median_low(bests)
        runs = [r for r in tuned["results"] if r["name"] == name]
        assert sorted(r["seed"] for r in runs) == [1, 2]  # the chosen point, on the seeds, never the tuning seed's
        for r in runs:
            for key, value in record["chosen"]["point"].items():
                if key == "lr":
                    assert r["config"]["optimizer"]["lr"] == value
        row = next(r for r in tuned["rows"] if r["name"] == name)
        assert row["final"] == pytest.approx(statistics.fmean(r["final"] for r in runs))
        assert row["final_sd"] == pytest.approx(statistics.stdev(r["final"] for r in runs))
    at_defaults = {r["name"]: r for r in doc["rows"]}
    assert at_defaults["AdamW"]["lr"] == 1e-2 and at_defaults["AdamW"]["n_seeds"] == 2  # the line-up's, same seeds
    for png in ("loss_curves.png", "loss_curves_tuned.png", "tuning.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"

    report = tmp_path / "report"
    assert main(["compare", "report", "--storage", f"sqlite:///{out / 'optuna.db'}", "--out", str(report)]) == 0
    rebuilt = json.loads((report / "results.json").read_text())
    assert {k: v for k, v in rebuilt.items() if k not in LIVE} == {k: v for k, v in doc.items() if k not in LIVE}
    assert "Ranking of the tuned optimizers" in capsys.readouterr().out


def test_algoperf_is_five_trials_by_three_studies_and_three_reseeds(tmp_path):
    from optcore.cli import build_parser
    from optcore.compare.commands import _protocol

    args = build_parser().parse_args(["compare", "--algoperf", "--seed", "4"])
    protocol, seeds = _protocol(args, 4)
    assert (protocol["trials"], protocol["studies"], seeds) == (5, 3, [5, 6, 7])
    args = build_parser().parse_args(["compare", "--studies", "3"])
    with pytest.raises(optcore.ConfigError, match="--trials"):
        _protocol(args, 0)


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path, capsys):
    out = tmp_path / "out"
    first = _compare(out, "--seeds", "0,1,2", "--budget", "0.5s")
    assert 1 <= len(first["results"]) < 6
    again = _compare(out, "--seeds", "0,1,2")
    assert len(again["results"]) == 6
    kept = {(r["name"], r["seed"]): r["losses"] for r in first["results"]}
    assert all(again_r["losses"] == kept[(again_r["name"], again_r["seed"])]
               for again_r in again["results"] if (again_r["name"], again_r["seed"]) in kept)  # fmt: skip
    slots = _finished_slots(f"sqlite:///{out / 'optuna.db'}", "compare")
    assert slots == {"compare": list(range(6))}  # each run once: the finished ones were not run again
    capsys.readouterr()
    assert main(["compare", "--optimizers", "AdamW", "--steps", "3", "--in-process", "--quiet", "--out", str(out)]) == 1
    assert "started with other settings (seeds, entries differ)" in capsys.readouterr().err


@pytest.mark.slow
def test_pruning_stops_trials_and_is_reported(tmp_path):
    """--prune: Optuna's median rule on the training loss stops a tuning trial's
    process; the trial is PRUNED in the storage and counted in the report."""
    config = tmp_path / "compare.yaml"
    config.write_text("configs:\n  - {name: AdamW, optimizer: {type: 'torch:AdamW', lr: 1.0e-2}, "
                      "search_space: {lr: [1.0e-5, 1.0]}}\n")  # fmt: skip
    out = tmp_path / "out"
    assert main(["compare", "--config", str(config), "--steps", "40", "--trials", "6", "--seeds", "1", "--prune",
                 "--jobs", "1", "--quiet", "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads((out / "results.json").read_text())
    (study,) = doc["tuned"]["optimizers"]["AdamW"]["studies"]
    pruned = [t for t in study["trials"] if t["status"] == "pruned"]
    assert study["pruned"] == len(pruned) >= 1 and all(t["final"] is None for t in pruned)
    stored = optuna.load_study(study_name="compare/AdamW/tune-0", storage=_storage(f"sqlite:///{out / 'optuna.db'}"))
    states = {t.number: t for t in stored.get_trials()}
    for t in pruned:
        frozen = states[t["number"]]
        assert frozen.state == optuna.trial.TrialState.PRUNED
        assert frozen.user_attrs["result"]["pruned_at"] >= 10  # not before a quarter of the run (n_warmup_steps)
        assert max(frozen.intermediate_values) == frozen.user_attrs["result"]["pruned_at"]


def test_a_worker_with_only_storage_and_study_joins_the_stored_sweep(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    first = _compare(tmp_path / "first", "--storage", url, "--study", "mine", names="torch:SGD", steps=2)
    rc = main(["compare", "--storage", url, "--study", "mine", "--in-process", "--quiet", "--out", str(tmp_path / "join")])
    assert rc == 0
    joined = json.loads((tmp_path / "join" / "results.json").read_text())
    assert {k: v for k, v in joined.items() if k not in LIVE} == {k: v for k, v in first.items() if k not in LIVE}
    assert joined["settings"]["steps"] == 2  # the stored sweep's, not the default 300
    assert _finished_slots(url, "mine") == {"mine": [0]}  # nothing ran twice
    capsys.readouterr()
    assert main(["compare", "report", "--storage", url, "--study", "other", "--out", str(tmp_path / "r")]) == 1
    assert "No comparison 'other' in this storage; it holds: mine" in capsys.readouterr().err
    assert main(["compare", "report", "--storage", f"sqlite:///{tmp_path / 'none.db'}"]) == 1
    assert "No such SQLite file" in capsys.readouterr().err and not (tmp_path / "none.db").exists()


def _no_plots(monkeypatch) -> None:
    """The comparison without its PNGs (tests of what is stored and reported, not drawn)."""
    from optcore.compare import report, scoreboard

    for module, name in ((report, "plot_curves"), (report, "plot_sweep"), (scoreboard, "plot_profile")):
        monkeypatch.setattr(module, name, lambda *a, **k: None)


def test_several_tasks_share_one_storage_and_report_from_it(tmp_path, capsys, monkeypatch):
    """--task a,b: each task is a sweep of its own under the study's index in one
    storage (here the default, optuna.db in --out), a worker with only --storage,
    --study and --task (the tasks are user code, which a worker runs only when it names
    them itself) joins all of them, and `compare report` rebuilds every task and the
    scores over both, equal to the live run."""
    _no_plots(monkeypatch)
    tasks = ["examples/my_task.py:task", "examples/my_task.py:RegressionTask"]  # two specs: two tasks
    folders = ["examples_my_task.py_task", "examples_my_task.py_RegressionTask"]
    live = tmp_path / "live"
    assert main(["compare", "--task", ",".join(tasks), "--optimizers", "torch:SGD", "--trials", "2", "--seeds", "1,2",
                 "--steps", "3", "--target", f"{tasks[0]}=9.0", "--in-process", "--quiet", "--out", str(live)]) == 0
    url = f"sqlite:///{live / 'optuna.db'}"
    assert set(optuna.get_all_study_names(_storage(url))) >= {"compare", *(f"compare/{f}" for f in folders)}
    joined, report = tmp_path / "joined", tmp_path / "report"
    assert main(["compare", "--storage", url, "--task", ",".join(tasks), "--in-process", "--quiet",
                 "--out", str(joined)]) == 0  # fmt: skip
    assert main(["compare", "report", "--storage", url, "--out", str(report)]) == 0
    first = json.loads((live / "results.json").read_text())
    assert first["complete"] and len(first["scores"]["problems"]) == 4  # 2 tasks x 2 re-seeds
    sources = {task: t["source"] for task, t in first["scores"]["targets"].items()}
    assert sources == {tasks[0]: "given", tasks[1]: "reference"}
    for other in (joined, report):
        again = json.loads((other / "results.json").read_text())
        assert {k: v for k, v in again.items() if k not in LIVE} == {k: v for k, v in first.items() if k not in LIVE}
        for folder in folders:
            one, two = (json.loads((d / folder / "results.json").read_text()) for d in (live, other))
            assert {k: v for k, v in two.items() if k not in LIVE} == {k: v for k, v in one.items() if k not in LIVE}
    assert _finished_slots(url, f"compare/{folders[0]}")[f"compare/{folders[0]}"] == [0, 1]  # each once, not rejoined
    capsys.readouterr()
    assert main(["compare", "--task", tasks[0], "--optimizers", "torch:SGD", "--steps", "3", "--in-process", "--quiet",
                 "--storage", url, "--out", str(tmp_path / "x")]) == 1  # fmt: skip
    assert f"is a sweep of several tasks ({', '.join(tasks)})" in capsys.readouterr().err


def test_a_result_for_a_trial_failed_as_stale_meanwhile_is_dropped(tmp_path):
    """A worker that was silent past the grace period (its trial failed and retried by
    another) finishes its run: the result is dropped, the retry counts."""
    from optcore.compare.study import Sweep, open_storage, sweep_meta

    meta = sweep_meta([{"name": "a", "optimizer": {"type": "torch:SGD", "lr": 0.1}}], {}, task={"spec": "char-lm"},
                      steps=2, seeds=[0], lr_sweep=None, lrs=None, extra={"summary": "", "memory_note": ""},
                      protocol={"trials": 0, "studies": 1, "sampler": "sobol", "sampler_seed": 0, "tuning_seed": 0})  # fmt: skip
    sweep = Sweep.open(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "s", meta)
    claimed = sweep.claim(lambda c: True, set())
    claimed.study.tell(claimed.number, state=optuna.trial.TrialState.FAIL)  # as fail_stale_trials does
    sweep.finish(claimed, {"status": "ok", "final": 1.0})
    assert "result" not in sweep.storage.get_trial(claimed.trial_id).user_attrs


def test_a_worker_that_joins_takes_the_stored_protocol(tmp_path, capsys, monkeypatch):
    """A worker with only --storage and --study runs the stored sweep's protocol: its
    tuning is announced, and a sweep that prunes is not run in-process (where a trial
    cannot be stopped, so this worker would not prune as the others do)."""
    _no_plots(monkeypatch)
    from optcore.compare.study import Sweep, open_storage, sweep_meta

    url = f"sqlite:///{tmp_path / 's.db'}"
    _compare(tmp_path / "first", "--trials", "1", "--seeds", "1", "--storage", url, "--study", "tuned",
             names="torch:SGD", steps=2)  # fmt: skip
    capsys.readouterr()
    assert main(["compare", "--storage", url, "--study", "tuned", "--in-process", "--quiet",
                 "--out", str(tmp_path / "join")]) == 0  # fmt: skip
    joined = capsys.readouterr().out
    assert "1 trials x 1 studies per optimizer" in joined and "own --target" not in joined
    # a joining worker with a --target of its own scores by it, and says the sweep's is another
    assert main(["compare", "--storage", url, "--study", "tuned", "--in-process", "--quiet", "--target", "3.5",
                 "--out", str(tmp_path / "join2")]) == 0  # fmt: skip
    said = " ".join(capsys.readouterr().out.split())
    assert "scores by its own --target 3.5; the sweep 'tuned' was started without a --target" in said
    meta = sweep_meta([{"name": "a", "optimizer": {"type": "torch:SGD", "lr": 0.1}}],
                      {"a": {"lr": {"low": 0.01, "high": 1.0, "log": True}}}, task={"spec": "char-lm"}, steps=2,
                      seeds=[1], lr_sweep=None, lrs=None, extra={"summary": "", "memory_note": ""},
                      protocol={"trials": 1, "studies": 1, "sampler": "sobol", "sampler_seed": 0, "tuning_seed": 0,
                                "prune": True})  # fmt: skip
    Sweep.open(open_storage(url), "pruned", meta)
    assert main(["compare", "--storage", url, "--study", "pruned", "--in-process", "--quiet",
                 "--out", str(tmp_path / "p")]) == 1  # fmt: skip
    assert "prunes its tuning trials (--prune)" in capsys.readouterr().err
    assert _finished_slots(url, "pruned") == {"pruned": [], "pruned/a/tune-0": []}  # nothing ran


# --------------------------------------------------------- shared workers
WORKER = ["--optimizers", "AdamW,torch:SGD", "--steps", "3", "--trials", "2", "--studies", "2", "--seeds", "1,2",
          "--in-process", "--quiet", "--heartbeat", "1"]  # fmt: skip
KILLED = ["--optimizers", "torch:SGD", "--steps", "300", "--seeds", "0,1", "--in-process", "--quiet", "--heartbeat", "1"]
#: 2 configs x 2 seeds at defaults, 2 x 2 trials x 2 studies, 2 x 2 re-seeds
PLANNED = {"defaults": 4, "tune": 8, "seeds": 4}


def _worker(tmp_path: Path, url: str, name: str, label: str, args: list[str] = WORKER) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-m", "optcore.cli", "compare", *args, "--storage", url, "--study", name,
         "--out", str(tmp_path / label)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def _check_shared(tmp_path: Path, url: str, name: str) -> None:
    """Two workers started together finish the sweep between them, each trial exactly
    once, and each worker's results.json and `compare report` show the same sweep."""
    workers = [_worker(tmp_path, url, name, label) for label in ("w1", "w2")]
    for w in workers:
        printed, _ = w.communicate(timeout=600)
        assert w.returncode == 0, printed
    slots = _finished_slots(url, name)
    assert slots[name] == list(range(PLANNED["defaults"]))
    tune = [s for n, s in slots.items() if "/tune-" in n]
    assert len(tune) == 4 and all(len(s) == len(set(s)) == 2 for s in tune)  # K trials in each of S x 2 studies
    assert sum(len(s) for s in tune) == PLANNED["tune"]
    assert [s for n, s in slots.items() if n.endswith("/seeds")] == [[0, 1], [0, 1]]
    storage = _storage(url)
    ran_by = {t.user_attrs["result"]["worker"] for n in slots for t in optuna.load_study(study_name=n, storage=storage)
              .get_trials() if "result" in t.user_attrs}  # fmt: skip
    assert len(ran_by) == 2  # both workers took trials
    docs = [json.loads((tmp_path / label / "results.json").read_text()) for label in ("w1", "w2")]
    one, two = ({k: v for k, v in d.items() if k not in LIVE} for d in docs)
    assert one == two  # both workers report the whole sweep, from the storage
    report = tmp_path / "report"
    assert main(["compare", "report", "--storage", url, "--study", name, "--out", str(report)]) == 0
    rebuilt = json.loads((report / "results.json").read_text())
    assert {k: v for k, v in rebuilt.items() if k not in LIVE} == one


def test_two_workers_share_one_sqlite_study(tmp_path):
    _check_shared(tmp_path, f"sqlite:///{tmp_path / 'shared.db'}", "shared")


def test_a_killed_workers_trial_is_run_again_by_another(tmp_path):
    """Worker A is killed (SIGKILL) while it runs a trial; worker B, started after,
    sees the trial's heartbeat stop, fails it and runs Optuna's retry of it."""
    url, name = f"sqlite:///{tmp_path / 'shared.db'}", "killed"
    a = _worker(tmp_path, url, name, "a", KILLED)
    storage = None
    deadline = time.monotonic() + 300
    running = []
    while time.monotonic() < deadline and not running:
        time.sleep(0.5)
        try:
            storage = storage or _storage(url)
            study = optuna.load_study(study_name=name, storage=storage)
            running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
        except (KeyError, optuna.exceptions.StorageInternalError):
            continue
    assert running, a.communicate()[0] if a.poll() is not None else "no trial started"
    os.killpg(a.pid, signal.SIGKILL)
    a.wait()
    killed = running[0].number
    b = _worker(tmp_path, url, name, "b", KILLED)
    printed, _ = b.communicate(timeout=900)
    assert b.returncode == 0, printed
    study = optuna.load_study(study_name=name, storage=_storage(url))
    trials = study.get_trials()
    assert trials[killed].state == optuna.trial.TrialState.FAIL and "result" not in trials[killed].user_attrs
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].user_attrs["optcore"] == trials[killed].user_attrs["optcore"]
    assert _finished_slots(url, name) == {name: [0, 1]}  # each run exactly once


def _run_children(pid: int) -> list[int]:
    """The spawned run processes (multiprocessing's spawn_main) whose parent is ``pid``."""
    children = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            cmdline = Path(stat).with_name("cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in cmdline and fields[0] != "Z":
            children.append(int(Path(stat).parent.name))
    return children


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_workers_run_process_ends_with_it(tmp_path):
    """SIGKILL leaves a daemon child running: the run's process watches its parent and
    ends within seconds of it, so a killed worker's run stops taking a core."""
    args = ["--optimizers", "torch:SGD", "--steps", "100000", "--seeds", "0", "--jobs", "1", "--quiet"]
    worker = _worker(tmp_path, f"sqlite:///{tmp_path / 's.db'}", "s", "w", args)
    deadline = time.monotonic() + 300
    children: list[int] = []
    while time.monotonic() < deadline and not children and worker.poll() is None:
        time.sleep(0.5)
        children = _run_children(worker.pid)
    assert children, worker.communicate()[0] if worker.poll() is not None else "no run process started"
    os.kill(worker.pid, signal.SIGKILL)  # the worker alone, not its process group
    worker.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(c) for c in children):
        time.sleep(0.5)
    try:
        assert not any(_alive(c) for c in children)
    finally:
        for c in children:
            if _alive(c):
                os.kill(c, signal.SIGKILL)


# --------------------------------------------------------------- PostgreSQL
def _postgres_bin() -> Path | None:
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)), None)
    return Path(found).resolve().parent if found else None


@pytest.fixture(scope="module")
def postgres_url():
    """A PostgreSQL server of this test's own (initdb in a temporary folder, TCP on
    127.0.0.1, trust authentication), stopped and removed afterwards."""
    pytest.importorskip("psycopg2", reason="psycopg2 (optcore[compare]) is not installed")
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server here: initdb is not on PATH nor in /usr/lib/postgresql/*/bin "
                    "(.ci/run installs Debian's postgresql)")
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="optcore-pg-"))
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and there is no postgres user to run initdb as")
        runner = shutil.which("runuser") or shutil.which("su")
        if runner is None:
            pytest.skip("running as root, and neither runuser nor su is here to run initdb as postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = [runner, "-u", "postgres", "--"] if runner.endswith("runuser") else None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = folder / "data"

    def run(*command: str) -> subprocess.CompletedProcess:
        if as_user is None:  # su -c takes one shell string
            return subprocess.run([shutil.which("su"), "postgres", "-c", " ".join(command)], capture_output=True, text=True)
        return subprocess.run([*as_user, *command], capture_output=True, text=True)

    init = run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    if init.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"initdb failed: {init.stderr.strip()[-300:]}")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections=50"
    start = run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "-o", f"'{options}'"
                if as_user is None else options, "start")  # fmt: skip
    if start.returncode != 0:
        log = (folder / "log").read_text() if (folder / "log").exists() else start.stderr
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"the PostgreSQL server did not start: {log.strip()[-300:]}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def test_two_workers_share_one_postgresql_study(tmp_path, postgres_url):
    _check_shared(tmp_path, postgres_url, "shared-pg")


def test_importing_optcore_does_not_import_optuna():
    code = "import sys, optcore, optcore.compare, optcore.compare.commands; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_workers_that_open_a_new_sqlite_storage_together_all_get_it(tmp_path):
    """Workers started together race to create the schema; on SQLite the loser sees
    "table ... already exists", which open_storage waits out like PostgreSQL's IntegrityError."""
    import threading

    from optcore.compare.study import open_storage

    failures: list[str] = []
    for k in range(8):
        url = f"sqlite:///{tmp_path / f'race{k}.db'}"

        def open_it(url: str = url) -> None:
            try:
                open_storage(url)
            except Exception as exc:  # noqa: BLE001 - the test collects whatever escapes
                failures.append(repr(exc))

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []


def test_ctrl_c_counts_every_finished_trial_of_the_sweep(tmp_path, capsys, monkeypatch):
    """Interrupted after the runs at defaults and two tuning trials: the message counts
    those 4 of the sweep's 8 trials (not the 2 runs at defaults of 2)."""
    from optcore.compare import runner

    real, calls = runner.run_one, []

    def run_one(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_one", run_one)
    _no_plots(monkeypatch)
    rc = main(["compare", "--optimizers", "AdamW,torch:SGD", "--steps", "2", "--trials", "2", "--seeds", "1",
               "--in-process", "--quiet", "--out", str(tmp_path / "out")])  # fmt: skip
    assert rc == 130
    assert "Interrupted: kept the 4 finished runs of 8; the same command resumes" in capsys.readouterr().out
