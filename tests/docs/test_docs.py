"""The documentation site: it builds with warnings as errors, the reference is
generated from the registry, and the examples on the getting-started page run."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("optcore_docs_gen_reference_test", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _installed(value: str) -> bool:
    return any(ep.value == value for ep in entry_points(group="optcore.optimizers"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for the module, from another working directory."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        check=False, cwd=out, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _page(site: Path, path: str) -> str:
    page = site / path / "index.html"
    assert page.exists(), f"no page {path}"
    return page.read_text(encoding="utf-8")


def test_docs_site_builds_with_a_reference_page_per_optimizer_and_scheduler(site: Path) -> None:
    adamw = _page(site, "reference/optimizers/adamw")
    for text in ("torch:AdamW", "weight_decay", "0.01", "supports_step_with_scale", "Hyper-parameters"):
        assert text in adamw, text
    cosine = _page(site, "reference/schedulers/cosine")
    assert "num_training_steps" in cosine and "optcore:cosine" in cosine
    assert "img/schedules/cosine.png" in cosine  # the scheduler helper's plot is on the page
    if _installed("optcore_lion:Lion"):
        lion = _page(site, "reference/optimizers/lion")
        assert "optcore-lion:Lion" in lion and "supports_memory_efficient_fp16" in lion
    index = _page(site, "reference/optimizers")
    assert 'href="adamw/' in index


def test_docs_markers_are_expanded_from_the_repository(site: Path) -> None:
    plugin = _page(site, "writing-a-plugin")
    assert "lion_update" in plugin and "optcore.optimizers" in plugin and "conformance_cases" in plugin
    assert "test_lion_conformance_per_dtype" in plugin  # the per-dtype kit test, included from the plugin
    assert "state_dict_roundtrip" in plugin  # the conformance kit's checks, listed from optcore.testing
    cli = _page(site, "cli")
    assert "optcore show" in cli and "usage: optcore" in cli
    plot = (DOCS / "img" / "compare.png").exists()
    assert bool(re.search(r"<img[^>]*compare\.png", cli)) == plot  # the plot when it exists, a note when it does not
    for html in site.rglob("*.html"):
        assert "<!-- optcore:" not in html.read_text(encoding="utf-8"), f"unexpanded marker in {html}"
    # the plain-file links under the markers are dropped: the quoted blocks carry the paths
    assert not re.search(r'href="[^"]*plugins/optcore-lion', plugin)


def test_docs_getting_started_examples_run() -> None:
    text = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert blocks
    namespace: dict = {}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import optcore

        try:
            for i, block in enumerate(blocks):
                exec(compile(block, f"getting-started.md[python block {i}]", "exec"), namespace)  # noqa: S102
        finally:
            try:
                optcore.unregister_optimizer("MySignSGD")  # the page registers it; leave the registry as found
            except KeyError:
                pass


def test_docs_reference_helpers() -> None:
    gen = _gen()
    assert gen.constraints({"minimum": 0.0, "exclusiveMaximum": 1.0}) == "in [0, 1)"
    assert gen.constraints({"ge": 0}) == ">= 0"  # pydantic's spelling when a constraint sits in Annotated
    beta = {"type": "number", "minimum": 0, "exclusiveMaximum": 1}
    betas = {"type": "array", "prefixItems": [beta, beta]}
    assert gen.constraints(betas) == "each in [0, 1)" and gen.type_name(betas, "tuple") == "tuple[float, float]"
    assert gen.type_name({"anyOf": [{"type": "boolean"}, {"type": "null"}]}, "x") == "bool | None"
    assert gen.escape("p *= 1 - lr*wd, `torch._foreach_*` a|b") == "p \\*= 1 - lr\\*wd, `torch._foreach_*` a\\|b"
    assert gen.fenced("has ``` inside").startswith("````text")
    assert gen._yaml_value(1e-8) == "1.0e-08" and gen._yaml_value((0.9, 0.99)) == "[0.9, 0.99]"


def test_docs_compare_plot_is_shown_once_it_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("optcore_docs_hooks_test", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hooks
    spec.loader.exec_module(hooks)
    monkeypatch.setattr(hooks, "COMPARE_PLOT", DOCS / "img" / "missing.png")
    assert "No plot in this build" in hooks._compare_plot("", 0)
    monkeypatch.setattr(hooks, "COMPARE_PLOT", DOCS / "img" / "schedules" / "cosine.png")  # any existing file
    assert hooks._compare_plot("", 0).endswith("(img/compare.png)")
    assert hooks._compare_plot("", 2).endswith("(../../img/compare.png)")  # relative to the page


QUOTING = re.compile(r"<!--\s*optcore:(include|outline|tree)\s+(.*?)\s*-->")


def test_writing_a_plugin_links_every_file_it_quotes_for_a_plain_reader() -> None:
    """Read on a code host, a marker is an invisible comment: the line under each
    one that quotes a file or folder is a link to it, by its path from docs/."""
    page = DOCS / "writing-a-plugin.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    quoted = [(i, m) for i, line in enumerate(lines) if (m := QUOTING.fullmatch(line.strip()))]
    assert len(quoted) >= 10
    for i, marker in quoted:
        rel = marker.group(2).partition("::")[0].strip().rstrip("/")
        link = re.fullmatch(r"\[([^\]]+)\]\(([^)\s]+)\)", lines[i + 1].strip()) if i + 1 < len(lines) else None
        assert link, f"line {i + 2}: no link under <!-- optcore:{marker.group(1)} {marker.group(2)} -->"
        target = (page.parent / link.group(2)).resolve()
        assert target == (ROOT / rel).resolve() and target.exists(), (i + 2, link.group(2), rel)
        assert rel in link.group(1) or rel.rsplit("/", 1)[-1] in link.group(1), link.group(1)  # readable text
    assert "mkdocs serve" in page.read_text(encoding="utf-8")  # and it says where the code shows inline


def test_a_plain_file_link_that_names_another_file_stops_the_build() -> None:
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    spec = importlib.util.spec_from_file_location("optcore_docs_hooks_links", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hooks
    spec.loader.exec_module(hooks)

    class Page:
        class file:  # noqa: N801 - mkdocs' attribute name
            src_uri = "writing-a-plugin.md"

    marker = "<!-- optcore:include plugins/optcore-lion/pyproject.toml -->"
    good = hooks.on_page_markdown(f"{marker}\n[pyproject](../plugins/optcore-lion/pyproject.toml)\nafter\n",
                                  Page, None, None)  # fmt: skip
    assert "[project.entry-points" in good and "](../plugins" not in good and good.rstrip().endswith("after")
    with pytest.raises(PluginError, match="names 'plugins/optcore-lion/README.md'"):
        hooks.on_page_markdown(f"{marker}\n[pyproject](../plugins/optcore-lion/README.md)\n", Page, None, None)
