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

ROOT = Path(__file__).resolve().parents[1]


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


def test_ctrl_c_keeps_the_finished_runs(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "optcore.cli", "compare", "--optimizers", "AdamW,torch:SGD,Adam,NAdam,RMSprop",
         "--steps", "400", "--in-process", "--quiet", "--out", str(out)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # A shell's background job starts with SIGINT ignored, and Python keeps an inherited
        # SIG_IGN: give the child the default, so Ctrl-C reaches it as it does in a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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
    assert process.returncode == 130, printed
    doc = json.loads(results.read_text())
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
