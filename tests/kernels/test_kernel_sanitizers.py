"""The plugins' native kernels under AddressSanitizer and UndefinedBehaviorSanitizer.

The kernel tests (each plugin's kernel, safety and batch tests) run again in a
subprocess whose kernels are built with ``-fsanitize=address,undefined``
(through ``$OPTCORE_KERNEL_CFLAGS``, into a private cache) and with the ASan
runtime preloaded (the Python interpreter is not built with it, and ASan must
come first). Any out-of-bounds access, use after free or undefined behaviour
in a kernel ends that process with the sanitizer's report; the test asserts a
clean exit. A canary first checks the set-up catches a real overflow: the Lion
kernel handed a size larger than its buffers, past the Python checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optcore import kernels

ROOT = Path(__file__).resolve().parents[2]
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"

#: The tests that drive the kernels (compiled-mode tests left out: they run no kernel).
KERNEL_TESTS = [
    "plugins/optcore-lion/tests/test_lion_state_safety.py",
    "plugins/optcore-lion/tests/test_lion_numerics.py",
    "plugins/optcore-adafactor/tests/test_adafactor_kernel.py",
    "plugins/optcore-adafactor/tests/test_adafactor_safety.py",
    "plugins/optcore-adafactor/tests/test_adafactor_batch.py",
]

#: The Lion kernel told each tensor holds 4096 elements, handed buffers of 16.
CANARY = """
import ctypes, torch
from optcore_lion import _cpu_kernel
lib = _cpu_kernel.load()
assert lib is not None, _cpu_kernel.unavailable_reason
p, g, m = (torch.zeros(16) for _ in range(3))
ptrs = [(ctypes.c_void_p * 1)(t.data_ptr()) for t in (p, g, m)]
lib.lion_fp32(1, *ptrs, (ctypes.c_int64 * 1)(4096), 0.1, 1.0, 0.9, 0.1, 0.99, 0.01, 1)
print("the overflow went unnoticed")
"""


def _sanitizer_runtime() -> str:
    """What to preload, or skip: the compiler's shared ASan runtime, and its
    C++ runtime (torch throws C++ exceptions, which ASan intercepts only when
    libstdc++ is loaded as it starts; the interpreter itself does not link it)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the ASan runtime is preloaded with LD_PRELOAD, which is Linux's")
    cc = kernels.compiler()
    if cc is None or shutil.which(cc) is None:
        pytest.skip("no C compiler here")
    found = []
    for name in ("libasan.so", "libstdc++.so.6"):
        probe = subprocess.run(
            [cc, f"-print-file-name={name}"], capture_output=True, text=True, timeout=30, check=False
        )
        path = probe.stdout.strip()
        if probe.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
            pytest.skip(f"{cc} names no shared {name} to preload (-print-file-name={name} gave {path!r})")
        found.append(os.path.realpath(path))
    probe = subprocess.run(
        [cc, *SANITIZE.split(), "-shared", "-fPIC", "-x", "c", "-", "-o", os.devnull],
        input="int f(void) { return 0; }\n", capture_output=True, text=True, timeout=60, check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"{cc} cannot build with {SANITIZE}: {probe.stderr[-300:]}")
    return " ".join(found)


def _env(tmp_path: Path, runtime: str) -> dict[str, str]:
    """Sanitized builds into a private cache; reports go to ``tmp_path/reports``
    (pytest captures file descriptor 2, so a report written there dies with the process)."""
    env = dict(os.environ)
    reports = tmp_path / "reports"
    reports.mkdir()
    env.update(
        OPTCORE_KERNEL_CFLAGS=SANITIZE,
        OPTCORE_CACHE_DIR=str(tmp_path / "cache"),
        LD_PRELOAD=runtime,
        # Python and torch allocate for the life of the process: leaks are not what is checked here
        ASAN_OPTIONS=f"detect_leaks=0:halt_on_error=1:log_path={reports}/asan",
        UBSAN_OPTIONS=f"print_stacktrace=1:halt_on_error=1:log_path={reports}/ubsan",
        PYTHONFAULTHANDLER="1",
    )
    env.pop("OPTCORE_ADAFACTOR_KERNEL", None)
    return env


def _run(args: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """The exit status, and every sanitizer report (which are then removed) followed by the output."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    reports = Path(env["ASAN_OPTIONS"].rsplit("log_path=", 1)[1]).parent
    found = sorted(reports.iterdir())
    text = "".join(path.read_text(errors="replace") for path in found)
    for path in found:
        path.unlink()
    return done.returncode, text[:6000] + done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path: Path) -> None:
    runtime = _sanitizer_runtime()
    env = _env(tmp_path, runtime)
    status, output = _run(["-c", CANARY], env, timeout=300)
    assert status != 0 and "AddressSanitizer: heap-buffer-overflow" in output, (
        "the sanitizer set-up did not catch an overflow:\n" + output
    )
    tests = [t for t in KERNEL_TESTS if (ROOT / t).exists()]
    assert tests, "no kernel tests found"
    pytest_args = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "not compiled", *tests]
    status, output = _run(pytest_args, env, timeout=900)
    assert status == 0, output
    assert "AddressSanitizer" not in output and "runtime error:" not in output, output
    assert " passed" in output, output
    built = {path.name.rsplit("_", 1)[0]: path for path in (tmp_path / "cache").glob("*.so")}
    assert {"lion_fp32", "adafactor_fp32"} <= set(built), sorted(built)
    for path in built.values():
        assert b"__asan_init" in path.read_bytes(), f"{path} was built without AddressSanitizer"
