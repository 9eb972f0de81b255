"""docs/writing-a-plugin.md's "Start from optcore-lion", done as the page says:
copy the plugin, rename its package, distribution and entry point, pip-install
the copy (into a folder of its own), and build the new name in a fresh process,
where optcore finds it by its entry point alone and the conformance kit passes it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "plugins" / "optcore-lion"
PAGE = ROOT / "docs" / "writing-a-plugin.md"


def _copy_as(dest: Path, package: str, dist: str, name: str) -> Path:
    """The page's steps 1-3: copy, rename the package, edit pyproject.toml."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    (dest / "src" / "optcore_lion").rename(dest / "src" / package)
    pyproject = dest / "pyproject.toml"
    text = pyproject.read_text()
    text = text.replace('name = "optcore-lion"', f'name = "{dist}"')
    text = text.replace('Lion = "optcore_lion:Lion"', f'{name} = "{package}:Lion"')
    text = text.replace("optcore_lion = ", f"{package} = ")
    pyproject.write_text(text)
    assert "optcore_lion" not in text and "optcore-lion" not in text, "the page's renames left the template's names"
    return dest


def test_the_page_lists_the_steps_this_test_takes() -> None:
    page = PAGE.read_text()
    section = page[page.index("## Start from optcore-lion"):]
    for step in ("cp -r plugins/optcore-lion", "mv my-lion/src/optcore_lion my-lion/src/my_lion",
                 'name = "my-lion"', 'MyLion = "my_lion:Lion"', "pip install ./my-lion"):
        assert step in section, step


@pytest.mark.slow
def test_a_plugin_copied_from_optcore_lion_installs_and_builds_by_name(tmp_path: Path) -> None:
    source = _copy_as(tmp_path / "my-lion", "my_lion", "my-lion", "MyLion")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    assert list(target.glob("my_lion-*.dist-info")), "pip installed no distribution metadata"
    program = """
import torch, optcore
from optcore.testing import run_check
spec = optcore.resolve("my-lion:MyLion")
assert (spec.source, spec.provider) == ("plugin", "my-lion"), (spec.source, spec.provider)
model = torch.nn.Linear(4, 2)
opt = optcore.build_optimizer({"type": "MyLion", "lr": 1e-3}, model)
before = model.weight.detach().clone()
model(torch.randn(3, 4)).sum().backward()
opt.step()
assert type(opt).__module__ == "my_lion.lion" and not torch.equal(before, model.weight)
for check in ("contract", "step_with_scale", "step_errors"):
    run_check(check, {"type": "my-lion:MyLion", "lr": 1e-3})
print("built", type(opt).__module__)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    env.pop("OPTCORE_PLUGINS", None)
    env.pop("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", None)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^built my_lion\.lion$", done.stdout, re.M), done.stdout
