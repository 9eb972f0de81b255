"""What a comparison keeps: failed configs in the table, finished runs after
Ctrl-C, every comparison in its own folder, labelled losses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from optcore.cli import main
from optcore.compare.report import write_results

ROOT = Path(__file__).resolve().parents[2]


def test_failed_configs_stay_in_the_table_with_their_error(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", "--optimizers", "AdamW,NoSuchOptimizer", "--steps", "2", "--in-process", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["NoSuchOptimizer"]["status"] == "failed" and "NoSuchOptimizer" in rows["NoSuchOptimizer"]["error"]
    assert rows["NoSuchOptimizer"]["rank"] == "-" and rows["AdamW"]["rank"] == "1"
    table = printed[: printed.index("NoSuchOptimizer failed:")]
    assert "NoSuchOptimizer" in table and "failed" in table  # a row of the table, then its error below


def test_results_are_written_atomically(tmp_path):
    path = tmp_path / "results.json"
    write_results(path, {"results": [1]})
    write_results(path, {"results": [1, 2]})
    assert json.loads(path.read_text())["results"] == [1, 2] and not (tmp_path / "results.json.tmp").exists()


def _ctrl_c_after_a_finished_run(tmp_path: Path, args: list[str], **popen: object) -> tuple[int, str, dict]:
    """Start ``optcore compare ARGS --out ...``, wait until a run has finished
    (results.json lists it), press Ctrl-C, and return (exit code, output, results)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "optcore.cli", "compare", *args, "--quiet", "--out", str(out)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # A shell's background job starts with SIGINT ignored, and Python keeps an inherited
        # SIG_IGN: give the child the default, so Ctrl-C reaches it as it does in a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen,
    )  # fmt: skip
    results = out / "results.json"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if results.exists() and json.loads(results.read_text())["results"]:
            break
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()[0]
    process.send_signal(signal.SIGINT)
    printed, _ = process.communicate(timeout=120)
    return process.returncode, printed, json.loads(results.read_text())


def test_ctrl_c_keeps_the_finished_runs(tmp_path):
    code, printed, doc = _ctrl_c_after_a_finished_run(
        tmp_path, ["--optimizers", "AdamW,torch:SGD,Adam,NAdam,RMSprop", "--steps", "400", "--in-process"]
    )
    assert code == 130, printed
    assert doc["interrupted"] and not doc["complete"]
    finished = [r for r in doc["results"]]
    assert 1 <= len(finished) < 5 and all(r["status"] == "ok" and len(r["losses"]) == 400 for r in finished)
    assert [r["name"] for r in doc["rows"]] and "Interrupted" in printed and "finished runs" in printed


def test_every_comparison_gets_its_own_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["compare", "--optimizers", "torch:SGD", "--steps", "1", "--in-process", "--quiet"]
    assert main(args) == 0 and main(args) == 0
    folders = sorted((tmp_path / "optcore-compare").iterdir())
    assert len(folders) == 2 and all((f / "results.json").exists() for f in folders)
    printed = capsys.readouterr().out
    assert all(f"results go to {Path('optcore-compare') / f.name}/" in printed for f in folders)


def test_the_losses_say_which_they_are(tmp_path, capsys):
    """The progress bar shows the training loss, the table the held-out loss: both labelled."""
    assert main(["compare", "--optimizers", "torch:SGD", "--steps", "2", "--in-process",
                 "--out", str(tmp_path / "out")]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "train loss" in printed and "held-out final" in printed


def test_runs_side_by_side_give_the_same_numbers_in_plan_order(tmp_path):
    """``--jobs 2`` runs two fresh processes at a time: every number but the
    timings is what one at a time gives, and results keep the plan's order."""
    docs = {}
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        assert main(["compare", "--optimizers", "torch:SGD,AdamW,Adam", "--steps", "12", "--quiet",
                     "--jobs", jobs, "--out", str(out)]) == 0  # fmt: skip
        docs[jobs] = json.loads((out / "results.json").read_text())
    assert docs["2"]["settings"]["jobs"] == 2 and "2 at a time" in docs["2"]["settings"]["isolation"]
    for one, two in zip(docs["1"]["results"], docs["2"]["results"], strict=True):
        assert (one["name"], one["losses"], one["final"]) == (two["name"], two["losses"], two["final"])
    assert [r["name"] for r in docs["2"]["results"]] == ["torch:SGD", "AdamW", "Adam"]


def test_default_jobs_fill_the_cores_and_stay_one_where_runs_would_share():
    from optcore.compare.runner import default_jobs

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert default_jobs(1, "cpu", False) == cores
    assert default_jobs(2, "cpu", False) == max(1, cores // 2)
    assert default_jobs(0, "cpu", False) == 1  # a run takes torch's default: every core
    assert default_jobs(1, "cuda", False) == 1 and default_jobs(1, "cpu", True) == 1


def test_in_process_runs_one_at_a_time(tmp_path, capsys):
    assert main(["compare", "--optimizers", "torch:SGD", "--steps", "1", "--in-process", "--jobs", "2",
                 "--quiet", "--out", str(tmp_path)]) == 1  # fmt: skip
    assert "--in-process runs one config at a time" in capsys.readouterr().err


def test_ctrl_c_with_runs_side_by_side_stops_them_and_keeps_the_finished(tmp_path):
    code, printed, doc = _ctrl_c_after_a_finished_run(
        tmp_path, ["--optimizers", "torch:SGD,AdamW,Adam,NAdam,RMSprop", "--steps", "500", "--jobs", "2"],
        start_new_session=True,  # Ctrl-C to the parent alone: its stop must end the children
    )
    assert code == 130, printed
    assert doc["interrupted"] and not doc["complete"] and len(doc["results"]) < 5
    assert all(r["status"] == "ok" and len(r["losses"]) == 500 for r in doc["results"])
