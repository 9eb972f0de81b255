"""Every generated figure in the README and the docs matches the results file it
was rendered from (docs/figures.py): the README cannot drift from what was measured."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from bench_helpers import ROOT, figures


@pytest.mark.parametrize("figure", figures.FIGURES, ids=lambda f: f.name)
def test_generated_section_matches_its_results_file(figure):
    assert figure.results.exists(), f"{figure.results} is missing: run `{figure.command}`"
    assert figures.current(figure) == figures.expected(figure), (
        f"{figure.page.name}'s {figure.name} section differs from {figure.results.name}: "
        "run `python docs/figures.py` (after the measuring command) and commit both"
    )


def test_check_mode_fails_on_a_stale_section(tmp_path, monkeypatch):
    (figure,) = [f for f in figures.FIGURES if f.name == "bench-core"]
    page = tmp_path / "README.md"
    page.write_text(figure.page.read_text().replace(figures.current(figure), "| stale |"))
    stale = figures.Figure(figure.name, page, figure.results, figure.command, figure.render)
    monkeypatch.setattr(figures, "FIGURES", [stale])
    assert figures.main(["--check"]) == 1
    assert figures.main([]) == 0 and figures.main(["--check"]) == 0


def test_the_compare_plot_the_readme_shows_exists():
    assert (ROOT / "docs" / "img" / "compare.png").stat().st_size > 10_000
    assert "docs/img/compare.png" in (ROOT / "README.md").read_text()


def test_the_readme_tells_a_newcomer_where_the_command_is_how_long_tests_take_and_what_repeats():
    readme = (ROOT / "README.md").read_text()
    dev = (ROOT / "scripts" / "dev").read_text()
    after_commands = readme.split("scripts/dev test    #", 1)[1].split("## ", 1)[0]
    # the venv scripts/dev makes, and the two ways to reach its command
    assert "VENV=${OPTCORE_VENV:-.venv}" in dev and '"$VENV/bin/optcore"' in dev
    assert "`.venv/bin/optcore`" in after_commands and "`source .venv/bin/activate`" in after_commands
    assert "<!-- BEGIN GENERATED: timing-test -->" in after_commands  # the test command's time, from timing.json
    (compare,) = [f for f in figures.FIGURES if f.name == "compare"]
    caption = figures.current(compare).rsplit("\n", 1)[-1]
    assert "same on every run" not in caption
    assert "same torch build and seed" in caption and "across machines" in caption and "2nd-3rd decimal" in caption


@pytest.mark.parametrize("name", ["timing-setup", "timing-test"])
def test_the_readmes_times_say_when_and_on_what_machine_they_were_measured(name):
    """Set-up and test times (and the test counts) age as main moves on: each says its
    date and machine, from timing.json, rather than reading as today's."""
    (figure,) = [f for f in figures.FIGURES if f.name == name]
    text = figures.current(figure)
    assert re.search(r"measured 20\d\d-\d\d-\d\d on [^)]*\b\d+ CPUs\)$", text), text
    data = json.loads(figure.results.read_text())
    if name == "timing-test":
        for key in ("passed", "skipped", "xfailed"):
            assert f"{data[key]:,} {key}" in text
        assert f"pytest itself {data['pytest_s']:.0f} s" in text


def test_a_timing_without_its_date_is_refused():
    data = json.loads((ROOT / "docs" / "results" / "timing.json").read_text())
    del data["test_measured"]
    with pytest.raises(KeyError):
        figures.render_test_time(data)


def test_the_protocol_summary_keeps_each_tasks_tuning_and_drops_the_curves(tmp_path):
    """--summarise-protocol reads a tuned multi-task --out folder: the top-level scores,
    and per task what the table shows, without the per-step losses of every run."""
    studies = [{"best": 2.0, "trials": [{"lr": 0.01, "final": 2.0, "status": "ok"}], "pruned": 0, "diverged": 0}]
    record = {"studies": studies, "chosen": {"point": {"lr": 0.01}, "lr": 0.01, "score": 2.0}, "score": 2.0,
              "unstable": {"diverged_lrs": [], "largest_ok_lr": 0.01, "from_lr": None}}
    row = {"name": "A", "lr": 0.01, "final": 2.1, "final_sd": 0.01, "n_seeds": 3, "status": "ok", "rank": "1",
           "runs": [0], "sweep": []}
    doc = {"protocol": {"trials": 1, "studies": 1, "seeds": [1, 2, 3]}, "elapsed_s": 3.0, "rows": [row],
           "settings": {"steps": 10, "device": "cpu", "threads": 1, "jobs": 1, "isolation": "in-process", "study": "s"},
           "results": [{"losses": [3.0, 2.0]}], "tuned": {"optimizers": {"A": record}, "rows": [row],
                                                        "results": [{"losses": [3.0, 2.0]}]}}
    (tmp_path / "char-lm").mkdir()
    (tmp_path / "char-lm" / "results.json").write_text(json.dumps(doc))
    top = {"tasks": {"char-lm": {"folder": "char-lm", "summary": "s", "complete": True}}, "scores": {"targets": {}}}
    (tmp_path / "results.json").write_text(json.dumps(top))
    summary = figures.summarise_protocol(tmp_path)
    entry = summary["tasks"]["char-lm"]
    assert summary["scores"] == {"targets": {}} and entry["optimizers"] == {"A": record}
    assert entry["reseeded"] == entry["defaults"] == [{k: row[k] for k in
                                                       ("name", "lr", "final", "final_sd", "n_seeds", "status", "rank")}]
    assert "losses" not in json.dumps(summary) and "study" not in entry["settings"]


@pytest.mark.parametrize(
    "figure", [f for f in figures.FIGURES if f.results.name.startswith("bench_")], ids=lambda f: f.name
)
def test_every_benchmark_figure_says_on_what_machine_it_was_measured(figure):
    """A ratio to the bandwidth bound depends on the CPU, its vector unit and its
    cache: each benchmark's results file records the machine, and its figure says it."""
    data = json.loads(figure.results.read_text())
    assert data.get("machine"), f"{figure.results.name} has no machine: run `{figure.command}` again"
    assert data["machine"] in figures.expected(figure)


def test_the_machine_names_the_cpu_its_cores_and_its_vector_unit():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    text = common.machine()
    assert f"{os.cpu_count()} logical CPUs" in text
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text().split() if cpuinfo.exists() else []
    if "avx512f" in flags:
        assert "AVX-512" in text
    elif "avx2" in flags:
        assert "AVX2" in text


def test_the_cache_size_reads_every_way_sysfs_writes_it():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    sizes = {"491520K\n": "480 MiB", "32768K": "32 MiB", "1M": "1 MiB", "16 MB": "16 MiB", "33554432": "32 MiB",
             "512K": "512 KiB", "": None, "unknown": None}
    assert {text: common.cache_size(text) for text in sizes} == sizes
