"""optcore as an ms-swift optimizer plugin, with the real ms-swift package.

The cases live in ``swift_cases.py`` and run here in a child pytest process,
because importing swift changes transformers for the whole process:
``swift.trainers.patcher`` replaces the Hugging Face Trainer's default
callbacks with ones that read swift-only arguments (``args.max_epochs``), so
every other HF Trainer test in the same session would fail after it.

ms-swift comes with the test extras (``scripts/dev setup``). Where it is not
installed this test skips, except where ``OPTCORE_REQUIRE_SWIFT=1`` (``.ci/run``
sets it): there a missing ms-swift, or a skipped case, is a failure.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("swift_cases.py")
REQUIRED = os.environ.get("OPTCORE_REQUIRE_SWIFT") == "1"


def ms_swift_version() -> str | None:
    """The installed ms-swift, read from its metadata (importing swift would patch transformers here)."""
    try:
        return importlib.metadata.version("ms-swift")
    except importlib.metadata.PackageNotFoundError:
        return None


def tail(proc: subprocess.CompletedProcess[str]) -> str:
    """The end of the child's output: its failures and its summary."""
    return proc.stdout[-6000:] + proc.stderr[-3000:]


def run_cases(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], ET.Element]:
    report = tmp_path / "swift-cases.xml"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", str(CASES), f"--junitxml={report}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if not report.exists():
        pytest.fail(f"the swift cases wrote no report (exit {proc.returncode}):\n{tail(proc)}")
    suite = ET.parse(report).getroot()
    return proc, suite if suite.tag == "testsuite" else suite.find("testsuite")


@pytest.mark.slow
def test_swift_cases_pass_in_their_own_process(tmp_path):
    if ms_swift_version() is None:
        message = 'ms-swift is not installed: scripts/dev setup installs it (or pip install -e ".[test]")'
        if REQUIRED:
            pytest.fail(f"OPTCORE_REQUIRE_SWIFT=1 and {message}")
        pytest.skip(message)
    proc, suite = run_cases(tmp_path)
    output = tail(proc)
    assert proc.returncode == 0, f"the swift cases failed (exit {proc.returncode}):\n{output}"
    ran, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    assert ran >= 6, f"expected the 6 swift cases, the child ran {ran}:\n{output}"
    if REQUIRED:
        assert skipped == 0, f"OPTCORE_REQUIRE_SWIFT=1 and {skipped} swift case(s) skipped:\n{output}"


def test_the_main_session_has_not_imported_swift():
    # Collection has imported every test module by now: none may bring swift's Trainer patch in here.
    assert "swift.trainers" not in sys.modules, "swift was imported in the main test process: keep it in swift_cases.py"
