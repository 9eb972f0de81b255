"""Every generated figure in the README and the docs matches the results file it
was rendered from (docs/figures.py): the README cannot drift from what was measured."""

from __future__ import annotations

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
