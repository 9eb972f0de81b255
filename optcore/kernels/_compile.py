"""Compiling a plugin's ``.c`` files into a cached library, within one time limit.

A library is compiled inside the cache directory under a temporary name and
renamed into place, so a reader never sees half a file. Every build has
warnings as errors (:data:`WARNING_FLAGS`), so a kernel that compiles here
compiles clean. The whole build, every flag set together, has one time limit
(``$OPTCORE_BUILD_TIMEOUT`` seconds, default :data:`DEFAULT_BUILD_TIMEOUT`),
so a compiler that hangs costs seconds. ``$OPTCORE_KERNEL_CFLAGS`` adds flags
to every build (and to the cache key): the sanitizer test builds the kernels
with ``-fsanitize=address,undefined`` through it.

The cache key holds what decides the machine code: the sources, the
compiler, the flags, the machine and the CPU's instruction-set extensions
(:func:`cpu_features`), so a cache shared between machines (an NFS home)
never hands one CPU a build for another's vector unit.

Where nothing can be built (Windows, no compiler, a build that fails), the
plugin takes its functional torch path; :func:`build_c_library` says why, and
warns once (:class:`KernelUnavailableWarning`): once per process for a machine
without a compiler, once per kernel for a build that fails.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from ._cache import existing_library, private_cache_dir, refuse, truncated

#: Seconds the whole build of one library may take (all flag sets together).
DEFAULT_BUILD_TIMEOUT = 30.0

#: Flags of every build: optimised position-independent shared code.
BASE_FLAGS = ("-O3", "-shared", "-fPIC")
#: Every build has warnings as errors.
WARNING_FLAGS = ("-Wall", "-Wextra", "-Werror")
#: With OpenMP threads, else without: the pragmas are then ignored on purpose.
DEFAULT_FLAG_SETS: tuple[tuple[str, ...], ...] = (("-fopenmp",), ("-Wno-unknown-pragmas",))


class KernelUnavailableWarning(RuntimeWarning):
    """A native kernel could not be built: the plugin runs its torch path (slower)."""


class _Timeout(Exception):
    """The build's time limit ran out."""


def compiler() -> str | None:
    """The C compiler to use, or ``None``."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def extra_flags() -> tuple[str, ...]:
    """``$OPTCORE_KERNEL_CFLAGS``, split as a shell would: added to every build."""
    return tuple(shlex.split(os.environ.get("OPTCORE_KERNEL_CFLAGS", "")))


@functools.cache
def cpu_features() -> str:
    """This CPU's instruction-set extensions, as the kernel cache key holds them:
    the ``flags`` (x86) or ``Features`` (Arm) line of ``/proc/cpuinfo``, which
    is what ``-march=native`` and ``target_clones`` resolve against; elsewhere
    the processor's name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return " ".join(sorted(value.split()))
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def _compile(cc: str, sources: Sequence[Path], flags: Sequence[str], out: Path, deadline: float) -> None:
    """Compile into a private temporary directory next to ``out``, then rename:
    same filesystem, so the rename is atomic and readers see the old file or the new one."""
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
    try:
        built = work / out.name
        _run_compiler([cc, *flags, *map(str, sources), "-o", str(built)], deadline)
        os.chmod(built, 0o700)
        with open(built, "rb") as f:
            os.fsync(f.fileno())  # on disk before the rename: a crash leaves no truncated library
        os.replace(built, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


_warned: set[str] = set()


def _unavailable(key: str, name: str, reason: str) -> tuple[None, str]:
    """``(None, reason)``, with one :class:`KernelUnavailableWarning` per ``key`` per process."""
    if key not in _warned:
        _warned.add(key)
        scope = "native CPU kernels are" if key == "machine" else f"the native kernel {name!r} is"
        warnings.warn(
            f"optcore: {scope} unavailable: {reason}. Optimizers that have one run their torch "
            "path instead: the same numbers, slower on CPU.",
            KernelUnavailableWarning,
            stacklevel=4,
        )
    return None, reason


def build_c_library(
    name: str,
    sources: Sequence[Path],
    flag_sets: Sequence[Sequence[str]] = DEFAULT_FLAG_SETS,
) -> tuple[ctypes.CDLL | None, str | None]:
    """Build (or reuse) the C files ``sources`` as the shared library ``name`` and load it.

    Each of ``flag_sets`` is added to :data:`BASE_FLAGS`, :data:`WARNING_FLAGS`
    and :func:`extra_flags`; they are tried in order (e.g. with OpenMP, then
    without), and the first that compiles and loads wins. Returns
    ``(library, None)`` or ``(None, reason)``, warning once (see the module
    docstring). A cache that fails the ownership/permission check is not used
    (a ``RuntimeWarning`` says why; see :mod:`._cache`).
    """
    if sys.platform == "win32":
        return _unavailable("machine", name, "optcore builds no native kernels on Windows")
    cc = compiler()
    if cc is None or shutil.which(cc) is None:
        return _unavailable("machine", name, f"no C compiler found ({cc or 'cc'}; set CC or install gcc/clang)")
    try:
        code = [Path(s).read_bytes() for s in sources]
    except OSError as exc:
        return _unavailable(name, name, f"its source is missing from the installed package ({exc})")
    limit = build_timeout()
    deadline = time.monotonic() + limit
    directory, problem = private_cache_dir()
    if problem is not None:
        directory = refuse(problem)
    extra = extra_flags()
    errors = []
    for variant in flag_sets:
        flags = [*BASE_FLAGS, *WARNING_FLAGS, *variant, *extra]
        identity = [*code, *(str(s).encode() for s in flags), cc.encode(), platform.machine().encode(),
                    cpu_features().encode()]
        key = hashlib.sha256(b"\0".join(identity)).hexdigest()[:16]
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
            _compile(cc, sources, flags, path, deadline)
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
    return _unavailable(name, name, "; ".join(errors))
