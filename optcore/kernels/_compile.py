"""Compiling a kernel library within one time limit, and :func:`build_c_library`.

A library is compiled inside the cache directory under a temporary name and
renamed into place, so a reader never sees half a file. The whole build, every
flag set together, has one time limit (``$OPTCORE_BUILD_TIMEOUT`` seconds,
default :data:`DEFAULT_BUILD_TIMEOUT`), so a compiler that hangs costs seconds.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from ._cache import existing_library, private_cache_dir, refuse, truncated

#: Seconds the whole build of one library may take (all flag sets together).
DEFAULT_BUILD_TIMEOUT = 30.0

_DEFAULT_FLAG_SETS = (("-O3", "-shared", "-fPIC", "-fopenmp"), ("-O3", "-shared", "-fPIC"))


class _Timeout(Exception):
    """The build's time limit ran out."""



def compiler() -> str | None:
    """The C compiler to use, or ``None``."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build_timeout() -> float:
    """Seconds one :func:`build_c_library` call may spend compiling (``$OPTCORE_BUILD_TIMEOUT``)."""
    raw = os.environ.get("OPTCORE_BUILD_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_BUILD_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        warnings.warn(
            f"OPTCORE_BUILD_TIMEOUT={raw!r} is not a positive number of seconds; "
            f"using {DEFAULT_BUILD_TIMEOUT:g}",
            RuntimeWarning,
            stacklevel=3,
        )
        return DEFAULT_BUILD_TIMEOUT
    return value


def _run_compiler(command: list[str], deadline: float) -> None:
    """Run the compiler in its own process group; on timeout kill the whole group
    (gcc's driver runs cc1, as and ld as children) so nothing is left running."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Timeout
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=remaining)
    except BaseException as exc:
        _kill_group(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise _Timeout from None
        raise
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, command, out, err)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group has exited already
    try:
        proc.communicate(timeout=5)  # reap it; a child that left the group may hold the pipes
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _compile(cc: str, source: str, flags: Sequence[str], out: Path, deadline: float) -> None:
    """Compile into a private temporary directory next to ``out``, then rename:
    same filesystem, so the rename is atomic and readers see the old file or the new one."""
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
    try:
        src = work / f"{out.stem}.c"
        src.write_text(source)
        built = work / out.name
        _run_compiler([cc, *flags, str(src), "-o", str(built)], deadline)
        os.chmod(built, 0o700)
        with open(built, "rb") as f:
            os.fsync(f.fileno())  # on disk before the rename: a crash leaves no truncated library
        os.replace(built, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_c_library(
    name: str,
    source: str,
    flag_sets: Sequence[Sequence[str]] = _DEFAULT_FLAG_SETS,
) -> tuple[ctypes.CDLL | None, str | None]:
    """Build (or reuse) ``source`` as a shared library and load it.

    ``flag_sets`` are tried in order (e.g. with OpenMP, then without); the first
    that compiles and loads wins. Returns ``(library, None)`` or ``(None, reason)``.
    A cache that fails the ownership/permission check is not used (a
    ``RuntimeWarning`` says why); see the module docstring.
    """
    cc = compiler()
    if cc is None:
        return None, "no C compiler found (set CC or install gcc/clang)"
    limit = build_timeout()
    deadline = time.monotonic() + limit
    directory, problem = private_cache_dir()
    if problem is not None:
        directory = refuse(problem)
    errors = []
    for flags in flag_sets:
        key = hashlib.sha256("\0".join([source, cc, *flags, platform.machine()]).encode()).hexdigest()[:16]
        path = directory / f"{name}_{key}.so"
        present, problem = existing_library(path)
        if problem is not None:
            path = refuse(problem) / path.name
            present, _ = existing_library(path)
        if present and not truncated(path):
            try:
                return ctypes.CDLL(str(path)), None
            except OSError:
                pass  # corrupted (garbage, wrong machine): rebuilt below, replacing it atomically
        try:
            _compile(cc, source, flags, path, deadline)
            return ctypes.CDLL(str(path)), None
        except _Timeout:
            errors.append(
                f"{cc} {' '.join(flags)}: timed out: the build may take {limit:g} s in all "
                "(set OPTCORE_BUILD_TIMEOUT to allow more)"
            )
            break  # the time is spent: no point trying the other flag sets
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            errors.append(f"{cc} {' '.join(flags)}: {exc} {detail.decode(errors='replace')[:300]}".strip())
    return None, "; ".join(errors)
