"""optcore.kernels: build, cache and load a C library; fail with a reason."""

from __future__ import annotations

import ctypes

import pytest

from optcore.kernels import build_c_library, cache_dir

SOURCE = "int add(int a, int b) { return a + b; }\n"


def test_builds_caches_and_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("OPTCORE_CACHE_DIR", str(tmp_path))
    lib, reason = build_c_library("t_add", SOURCE, [["-O2", "-shared", "-fPIC"]])
    if lib is None:
        pytest.skip(f"no working C compiler here: {reason}")
    lib.add.argtypes = [ctypes.c_int, ctypes.c_int]
    assert lib.add(2, 3) == 5 and reason is None
    built = list(cache_dir().glob("t_add_*.so"))
    assert len(built) == 1
    again, _ = build_c_library("t_add", SOURCE, [["-O2", "-shared", "-fPIC"]])
    assert again is not None and list(cache_dir().glob("t_add_*.so")) == built


def test_without_a_compiler_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("OPTCORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    lib, reason = build_c_library("t_none", SOURCE)
    assert lib is None and "no-such-cc" in reason
