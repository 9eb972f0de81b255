"""optcore.kernels: build, cache and load a C library from its files; fail with a
reason and one warning; never load a library someone else could have planted; a
hanging compiler costs seconds; warnings are errors; the CPU is in the key."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optcore import kernels
from optcore.kernels import _cache, _compile, build_c_library, cache_dir

ADD = "int add(int a, int b) { return a + b; }\n"
FLAGS = [[]]

# What an attacker would plant at the predictable path: its constructor runs on load.
PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("OPTCORE_TEST_MARKER");
    FILE *f = marker ? fopen(marker, "w") : NULL;
    if (f) fclose(f);
}
int add(int a, int b) { return a - b; }
"""

OTHER_UID = 4242


def _cc() -> str:
    cc = kernels.compiler()
    if cc is None or shutil.which(cc) is None:
        pytest.skip("no C compiler here")
    return cc


def _add(lib: ctypes.CDLL) -> int:
    lib.add.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib.add(2, 3)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An unused cache directory (not created yet) and a marker the planted constructor writes."""
    monkeypatch.setenv("OPTCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPTCORE_TEST_MARKER", str(tmp_path / "planted-code-ran"))
    monkeypatch.delenv("OPTCORE_BUILD_TIMEOUT", raising=False)
    monkeypatch.delenv("OPTCORE_KERNEL_CFLAGS", raising=False)
    monkeypatch.setattr(_compile, "_warned", set())  # each test sees its own first warning
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory outside the cache holding the test's C source."""
    directory = tmp_path_factory.mktemp("src")
    (directory / "add.c").write_text(ADD)
    return directory


@pytest.fixture
def source(sources: Path) -> list[Path]:
    """The C files of the test library."""
    return [sources / "add.c"]


def _library_name(
    source: list[Path], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, bytes]:
    """The file name (predictable: name and hash) and bytes of ``name``'s library,
    learned by building it in a scratch cache."""
    _cc()
    scratch = tmp_path / "scratch"
    with monkeypatch.context() as m:
        m.setenv("OPTCORE_CACHE_DIR", str(scratch))
        lib, reason = build_c_library(name, source, FLAGS)
        assert lib is not None, reason
    (built,) = scratch.glob(f"{name}_*.so")
    return built.name, built.read_bytes()


def _plant(path: Path, tmp_path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "planted.c"
    src.write_text(PLANTED)
    subprocess.run([_cc(), "-shared", "-fPIC", str(src), "-o", str(path)], check=True)


def test_builds_caches_and_loads(source: list[Path], cache: Path) -> None:
    _cc()
    lib, reason = build_c_library("t_add", source, FLAGS)
    assert lib is not None, reason
    assert _add(lib) == 5 and reason is None
    built = list(cache_dir().glob("t_add_*.so"))
    assert len(built) == 1
    again, _ = build_c_library("t_add", source, FLAGS)
    assert again is not None and list(cache_dir().glob("t_add_*.so")) == built


def test_cache_directory_and_library_are_private(source: list[Path], cache: Path) -> None:
    _cc()
    old = os.umask(0)  # the most permissive umask must not leak into the cache
    try:
        lib, reason = build_c_library("t_private", source, FLAGS)
    finally:
        os.umask(old)
    assert lib is not None, reason
    assert _mode(cache) == 0o700
    (built,) = cache.glob("t_private_*.so")
    assert _mode(built) & 0o077 == 0
    assert [p.name for p in cache.iterdir()] == [built.name]  # no temporary build files left


def test_library_is_written_under_a_temporary_name_then_renamed(
    source: list[Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cc()
    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def recording_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        renames.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    lib, reason = build_c_library("t_atomic", source, FLAGS)
    assert lib is not None, reason
    (built,) = cache.glob("t_atomic_*.so")
    ((src, dst),) = renames
    assert dst == built and src != dst
    assert src.parent.parent == cache  # built in a private dir inside the cache: same filesystem


def test_planted_library_writable_by_others_is_not_loaded(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filename, _ = _library_name(source, "t_planted_mode", tmp_path, monkeypatch)
    cache.mkdir(mode=0o700)
    _plant(cache / filename, tmp_path)
    os.chmod(cache / filename, 0o777)
    with pytest.warns(RuntimeWarning, match=r"writable by group or others \(mode 777\)"):
        lib, reason = build_c_library("t_planted_mode", source, FLAGS)
    assert not (tmp_path / "planted-code-ran").exists(), "the planted library's constructor ran"
    assert lib is not None, reason
    assert _add(lib) == 5  # our own build, from the private fallback directory
    assert Path(lib._name).parent == _cache.fallback_dir()
    assert _mode(_cache.fallback_dir()) == 0o700


@pytest.mark.skipif(getattr(os, "geteuid", lambda: -1)() != 0, reason="chown to another user needs root")
def test_planted_library_owned_by_another_user_is_not_loaded(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filename, _ = _library_name(source, "t_planted_owner", tmp_path, monkeypatch)
    cache.mkdir(mode=0o700)
    _plant(cache / filename, tmp_path)
    os.chmod(cache / filename, 0o700)
    os.chown(cache / filename, OTHER_UID, OTHER_UID)
    with pytest.warns(RuntimeWarning, match=f"owned by uid {OTHER_UID}, not by this user"):
        lib, reason = build_c_library("t_planted_owner", source, FLAGS)
    assert not (tmp_path / "planted-code-ran").exists(), "the planted library's constructor ran"
    assert lib is not None and _add(lib) == 5, reason


def test_cache_directory_writable_by_others_is_not_used(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filename, _ = _library_name(source, "t_shared_dir", tmp_path, monkeypatch)
    cache.mkdir()
    os.chmod(cache, 0o777)  # like /tmp without the sticky bit: anyone may swap files in it
    _plant(cache / filename, tmp_path)
    os.chmod(cache / filename, 0o700)  # the file itself looks fine; the directory is the problem
    with pytest.warns(RuntimeWarning, match=r"cache.* is writable by group or others \(mode 777\)"):
        lib, reason = build_c_library("t_shared_dir", source, FLAGS)
    assert not (tmp_path / "planted-code-ran").exists(), "the planted library's constructor ran"
    assert lib is not None and _add(lib) == 5, reason
    assert _mode(cache) == 0o777  # refused, not silently changed


@pytest.mark.skipif(getattr(os, "geteuid", lambda: -1)() != 0, reason="chown to another user needs root")
def test_cache_directory_owned_by_another_user_is_not_used(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filename, _ = _library_name(source, "t_foreign_dir", tmp_path, monkeypatch)
    cache.mkdir(mode=0o700)
    _plant(cache / filename, tmp_path)
    os.chmod(cache / filename, 0o700)
    os.chown(cache, OTHER_UID, OTHER_UID)
    with pytest.warns(RuntimeWarning, match=f"cache is owned by uid {OTHER_UID}"):
        lib, reason = build_c_library("t_foreign_dir", source, FLAGS)
    assert not (tmp_path / "planted-code-ran").exists(), "the planted library's constructor ran"
    assert lib is not None and _add(lib) == 5, reason


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda good: good[: len(good) // 3], id="truncated"),  # dlopen itself would SIGBUS
        pytest.param(lambda good: good[:40], id="truncated-header"),
        pytest.param(lambda good: b"", id="empty"),
        pytest.param(lambda good: b"not a library\n" * 100, id="garbage"),  # dlopen raises OSError
    ],
)
def test_corrupted_library_is_rebuilt(
    source: list[Path],
    damage,
    cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    name = f"t_corrupt_{request.node.callspec.id.replace('-', '_')}"
    filename, good = _library_name(source, name, tmp_path, monkeypatch)
    cache.mkdir(mode=0o700)
    (cache / filename).write_bytes(damage(good))  # e.g. a build cut short by a crash or a full disk
    os.chmod(cache / filename, 0o700)
    lib, reason = build_c_library(name, source, FLAGS)
    assert lib is not None and _add(lib) == 5, reason
    assert (cache / filename).read_bytes() == good  # replaced in the cache, not just worked around


def test_truncation_check_accepts_intact_libraries(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, good = _library_name(source, "t_intact", tmp_path, monkeypatch)
    (tmp_path / "intact.so").write_bytes(good)
    (tmp_path / "short.so").write_bytes(good[:-1])  # one byte short
    assert not _cache.truncated(tmp_path / "intact.so")
    assert _cache.truncated(tmp_path / "short.so")


def test_hanging_compiler_times_out_quickly_with_the_reason(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "hanging-cc"
    # a driver whose child hangs, like gcc waiting on cc1: the whole group must go
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("OPTCORE_BUILD_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.warns(kernels.KernelUnavailableWarning, match="'t_hang' is unavailable.*timed out"):
        lib, reason = build_c_library("t_hang", source)  # two flag sets: one time limit for both
    elapsed = time.monotonic() - start
    assert lib is None
    assert elapsed < 10
    assert reason is not None and "hanging-cc" in reason and "timed out" in reason
    assert "OPTCORE_BUILD_TIMEOUT" in reason and reason.count("timed out") == 1
    child = int(pidfile.read_text())
    for _ in range(50):  # killed; give the kernel a moment to reap it
        if not Path(f"/proc/{child}").exists() or "State:\tZ" in Path(f"/proc/{child}/status").read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the compiler's child process was left running")


def test_bad_timeout_value_warns_and_uses_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTCORE_BUILD_TIMEOUT", "soon")
    with pytest.warns(RuntimeWarning, match="OPTCORE_BUILD_TIMEOUT='soon'"):
        assert kernels.build_timeout() == kernels.DEFAULT_BUILD_TIMEOUT
    monkeypatch.setenv("OPTCORE_BUILD_TIMEOUT", "2.5")
    assert kernels.build_timeout() == 2.5


def test_without_a_compiler_says_why(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(kernels.KernelUnavailableWarning, match="no C compiler found"):
        lib, reason = build_c_library("t_none", source)
    assert lib is None and reason is not None and "no-such-cc" in reason
    assert "set CC" in reason


def test_no_compiler_warns_once_for_every_kernel(
    source: list[Path], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(kernels.KernelUnavailableWarning, match="no C compiler found.*torch path") as record:
        for name in ("t_first", "t_second", "t_first"):
            lib, reason = build_c_library(name, source)
            assert lib is None and reason is not None
    assert len(record) == 1


def test_windows_builds_nothing_and_says_so_once(
    source: list[Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.warns(kernels.KernelUnavailableWarning, match="no native kernels on Windows") as record:
        assert build_c_library("t_win", source)[0] is None
        assert build_c_library("t_win2", source)[0] is None
    assert len(record) == 1
    assert not cache.exists()  # nothing was built or cached


def test_cache_check_without_user_ids(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where os has no geteuid (Windows), the permission check still runs and nothing raises."""
    monkeypatch.delattr(os, "geteuid")
    tmp_path.chmod(0o700)
    assert _cache.untrusted(tmp_path, os.stat(tmp_path)) is None
    tmp_path.chmod(0o777)
    assert "writable by group or others" in (_cache.untrusted(tmp_path, os.stat(tmp_path)) or "")


def test_warnings_are_errors(cache: Path, tmp_path: Path) -> None:
    _cc()
    sloppy = tmp_path / "sloppy.c"
    sloppy.write_text("int add(int a, int b) { int unused; return a + b; }\n")
    with pytest.warns(kernels.KernelUnavailableWarning, match="'t_sloppy' is unavailable") as record:
        lib, reason = build_c_library("t_sloppy", [sloppy], FLAGS)
        build_c_library("t_sloppy", [sloppy], FLAGS)
    assert lib is None and reason is not None
    assert "-Werror" in reason and "unused" in reason
    assert len(record) == 1


def test_cpu_instruction_set_and_extra_flags_are_in_the_cache_key(
    source: list[Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache shared by two CPUs keeps one build per instruction set: an AVX-512
    build is never loaded on an AVX2 machine."""
    _cc()
    assert kernels.cpu_features()  # this machine's, e.g. the flags line of /proc/cpuinfo
    for features in ("fpu sse2 avx2", "fpu sse2 avx2 avx512f"):
        monkeypatch.setattr(_compile, "cpu_features", lambda features=features: features)
        lib, reason = build_c_library("t_isa", source, FLAGS)
        assert lib is not None, reason
    assert len(list(cache.glob("t_isa_*.so"))) == 2
    monkeypatch.setenv("OPTCORE_KERNEL_CFLAGS", "-DUNUSED_MACRO=1 -O1")
    lib, reason = build_c_library("t_isa", source, FLAGS)
    assert lib is not None and _add(lib) == 5, reason
    assert len(list(cache.glob("t_isa_*.so"))) == 3


PLUGIN_SOURCES = sorted((Path(__file__).parents[2] / "plugins").glob("*/src/*/csrc/*.c"))


@pytest.mark.parametrize("variant", _compile.DEFAULT_FLAG_SETS, ids=["openmp", "no-openmp"])
@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=[p.name for p in PLUGIN_SOURCES])
def test_plugin_kernels_compile_without_warnings(path: Path, variant: tuple[str, ...], cache: Path) -> None:
    """Every kernel a plugin ships builds with -Wall -Wextra -Werror, with OpenMP and without."""
    _cc()
    lib, reason = build_c_library(f"t_{path.stem}", [path], [variant])
    assert lib is not None, reason


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=[p.name for p in PLUGIN_SOURCES])
def test_plugin_kernels_are_package_data(path: Path) -> None:
    """A plain ``pip install plugins/<dist>`` ships the kernel: its pyproject lists it as package data."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    package = path.parent.parent
    dist = package.parent.parent
    config = tomllib.loads((dist / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"][package.name]
    relative = path.relative_to(package).as_posix()
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), (relative, patterns)


def test_a_prediction_takes_meta_tensors_as_cpu_tensors_and_runs_no_kernel() -> None:
    """Within ``predicting()`` a meta tensor passes where its CPU twin would (and only
    then), ``run_kernel`` reports the declared scratch and calls nothing; outside
    it the call runs and reports the same scratch."""
    import torch

    meta, half = torch.empty(8, device="meta"), torch.empty(8, device="meta", dtype=torch.float16)
    assert "meta" in kernels.pointer_problem(meta, torch.float32)
    counted: list[int] = []
    calls: list[int] = []
    with kernels.counting_scratch(counted.append):
        with kernels.predicting():
            assert kernels.is_predicting()
            assert kernels.pointer_problem(meta, torch.float32) is None
            assert "float16" in kernels.pointer_problem(half, torch.float32)
            assert "contiguous" in kernels.pointer_problem(torch.empty(4, 4, device="meta").t(), torch.float32)
            assert kernels.run_kernel(lambda: calls.append(1), scratch=64) is None
        assert not kernels.is_predicting()
        kernels.run_kernel(lambda: calls.append(2), scratch=32)
    kernels.run_kernel(lambda: calls.append(3), scratch=16)  # nobody counting
    assert calls == [2, 3] and counted == [64, 32]
    asked: list[int] = []
    kernels.run_kernel(lambda: None, scratch=lambda: asked.append(1) or 8)  # nobody counting: not asked
    with kernels.counting_scratch(counted.append):
        kernels.run_kernel(lambda: None, scratch=lambda: asked.append(2) or 8)
        with pytest.raises(ValueError, match="0 or more"):
            kernels.run_kernel(lambda: None, scratch=-1)
    assert asked == [2] and counted[-1] == 8
