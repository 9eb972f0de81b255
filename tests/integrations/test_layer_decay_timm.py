"""``layer_decay`` on timm's models against timm's own ``param_groups_layer_decay``
(and ``create_optimizer_v2(model, layer_decay=...)``): the same groups, in the
same order, with the same parameters, ``lr_scale`` and ``weight_decay``.

timm is not in the test extras: it requires torchvision, and pip would bring
PyPI's, which does not import beside torch's CPU wheel (and would make
transformers try to import it). ``scripts/dev setup`` installs timm alone
(``--no-deps``) into ``.venv/reference/timm``, off the venv's path, and this
test runs :mod:`timm_layer_decay_cases` in a child process with that folder on
its path (see that file for the torchvision stand-in). An environment where
``import timm`` works uses its own timm. Without timm the test skips, except
where ``OPTCORE_REQUIRE_TIMM=1`` (``.ci/run``): there it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REQUIRED = os.environ.get("OPTCORE_REQUIRE_TIMM") == "1"


def _timm_path() -> str | None:
    """The folder to put on the child's path ('' when timm imports here already), or None."""
    if importlib.util.find_spec("timm") is not None:
        return ""
    for candidate in (os.environ.get("OPTCORE_TIMM_PATH"), str(Path(sys.prefix) / "reference" / "timm")):
        if candidate and (Path(candidate) / "timm" / "__init__.py").is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def cases() -> dict:
    path = _timm_path()
    if path is None:
        message = "timm is not installed (scripts/dev setup puts it in .venv/reference/timm)"
        if REQUIRED:
            pytest.fail(f"OPTCORE_REQUIRE_TIMM=1 and {message}")
        pytest.skip(message)
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    run = subprocess.run(
        [sys.executable, str(HERE / "timm_layer_decay_cases.py")],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout)


def test_cases_ran_on_timm(cases):
    assert cases["timm"].split(".")[0] == "1"
    assert len(cases["cases"]) == 6


@pytest.mark.parametrize("index", range(6))
def test_layer_decay_gives_timms_groups(cases, index):
    case = cases["cases"][index]
    timm_groups, ours = case["timm"], case["optcore"]
    assert case["timm_create_optimizer_v2"] == timm_groups  # what a timm user gets from the factory
    assert len(timm_groups) > 2  # layers were found: not one group for the whole model
    assert [{k: v for k, v in g.items() if k != "lr"} for g in ours] == timm_groups
    assert sum(len(g["params"]) for g in ours) == case["trainable"]
    for group in ours:  # optcore applies the scale at construction (timm's schedulers apply it per step)
        assert group["lr"] == pytest.approx(1e-3 * group["lr_scale"])
    assert case["get_lr"] == pytest.approx(1e-3)  # the base lr, as set_lr takes it
    # timm's group names: layer_<id>_decay / layer_<id>_no_decay
    assert all(n.startswith("layer_") and n.endswith(("_decay", "_no_decay")) for n in case["optcore_names"])
