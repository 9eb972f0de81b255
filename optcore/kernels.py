"""Small C kernels for CPU optimizer steps, built on first use.

torch's eager ops make one pass over memory per op; an optimizer step written as
one C loop makes one pass in all, which is what gets a step close to the memory
bandwidth bound on CPU. Plugins ship the C source; :func:`build_c_library`
compiles it with the system compiler (``$CC``, else ``cc``/``gcc``/``clang``),
caches the shared library under ``$OPTCORE_CACHE_DIR`` (else
``~/.cache/optcore``) keyed by source, compiler, flags and machine, and loads it
with :mod:`ctypes`. No torch headers are needed, so a build takes a fraction of a
second. Without a compiler the caller falls back to torch ops and can show the
reason.

Why the cache is checked before anything in it is loaded: loading a shared
library runs its constructors in this process, and the file names are
predictable. So, as ssh does for ``~/.ssh`` and pip for its cache, a cache
directory or library that is not owned by the current user, or that group or
others may write, is refused with a warning, and the library is built in a
fresh private temporary directory instead. The cache directory is created
``0700``; a library is compiled inside it under a temporary name and renamed
into place, so a reader never sees half a file. A cached library that fails to
load (a truncated file, which is checked for before ``dlopen`` could crash on
it) is rebuilt. The whole build, every flag set together,
has one time limit (``$OPTCORE_BUILD_TIMEOUT`` seconds, default
:data:`DEFAULT_BUILD_TIMEOUT`), so a compiler that hangs costs seconds.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_BUILD_TIMEOUT", "build_c_library", "build_timeout", "cache_dir", "compiler", "pointer_problem"]

#: Seconds the whole build of one library may take (all flag sets together).
DEFAULT_BUILD_TIMEOUT = 30.0

_DEFAULT_FLAG_SETS = (("-O3", "-shared", "-fPIC", "-fopenmp"), ("-O3", "-shared", "-fPIC"))


class _Timeout(Exception):
    """The build's time limit ran out."""


def cache_dir() -> Path:
    """Where built libraries are kept (when that directory passes :func:`_untrusted`)."""
    root = os.environ.get("OPTCORE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "optcore"
    )
    return Path(root)


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


def _untrusted(path: Path, st: os.stat_result) -> str | None:
    """Why ``path`` must not be trusted, or ``None``: owned by someone else, or
    writable by group or others (they could plant or swap a library)."""
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _private_cache_dir() -> tuple[Path, str | None]:
    """The cache directory, created ``0700`` if missing, and why it is refused (or ``None``)."""
    path = cache_dir()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # mkdir's mode is masked by the umask; make it exact
        except FileExistsError:
            pass
        st = os.stat(path)
    except OSError as exc:
        return path, f"{path} cannot be created ({exc})"
    if not stat.S_ISDIR(st.st_mode):
        return path, f"{path} is not a directory"
    return path, _untrusted(path, st)


@functools.cache
def _fallback_dir() -> Path:
    """A fresh private directory for this process (``mkdtemp`` makes it ``0700``), removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="optcore-kernels-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _refuse(problem: str) -> Path:
    fallback = _fallback_dir()
    warnings.warn(
        f"optcore.kernels: not loading from the kernel cache: {problem}. Building in the private "
        f"temporary directory {fallback} instead (slower: it is rebuilt in every process). "
        "Fix: make the cache yours and private (chown to you, chmod go-w; remove files you did not "
        "build), or point OPTCORE_CACHE_DIR at a directory only you can write.",
        RuntimeWarning,
        stacklevel=3,
    )
    return fallback


def _existing_library(path: Path) -> tuple[bool, str | None]:
    """Whether a library is at ``path``, and why it must not be loaded (or ``None``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False, None
    if not stat.S_ISREG(st.st_mode):
        return True, f"{path} is not a regular file"
    return True, _untrusted(path, st)


def _truncated(path: Path) -> bool:
    """Whether an ELF file is shorter than its headers say. ``dlopen`` maps the
    segments the headers list, and touching a page past the end of a truncated
    file kills the process with SIGBUS instead of raising; so check first.
    Files that are not ELF are left for ``dlopen`` to judge (it raises)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if not head.startswith(b"\x7fELF"):
                return b"\x7fELF".startswith(head)  # empty, or cut inside the magic number
            if len(head) < 6 or head[4] not in (1, 2) or head[5] not in (1, 2):
                return len(head) < 6  # an unknown class or byte order: dlopen's to judge
            wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
            header = struct.Struct(order + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"))
            if len(head) < 16 + header.size:
                return True
            fields = header.unpack_from(head, 16)
            phoff, shoff, phentsize, phnum, shentsize, shnum = (*fields[4:6], *fields[8:12])
            if shoff + shentsize * shnum > size or phoff + phentsize * phnum > size:
                return True
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False  # unreadable: dlopen will say why
    entry = struct.Struct(order + ("IIQQQQQQ" if wide else "IIIIIIII"))
    if phentsize < entry.size:
        return False  # not a layout we know: dlopen's to judge
    for i in range(phnum):
        values = entry.unpack_from(table, i * phentsize)
        offset, filesz = (values[2], values[5]) if wide else (values[1], values[4])
        if offset + filesz > size:
            return True
    return False


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
    directory, problem = _private_cache_dir()
    if problem is not None:
        directory = _refuse(problem)
    errors = []
    for flags in flag_sets:
        key = hashlib.sha256("\0".join([source, cc, *flags, platform.machine()]).encode()).hexdigest()[:16]
        path = directory / f"{name}_{key}.so"
        present, problem = _existing_library(path)
        if problem is not None:
            path = _refuse(problem) / path.name
            present, _ = _existing_library(path)
        if present and not _truncated(path):
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


def pointer_problem(t: Any, dtype: Any) -> str | None:
    """Why a C kernel may not be handed ``t``'s data pointer as ``dtype``
    elements, or ``None`` when it may: a plain (not subclassed) CPU tensor of
    that dtype, contiguous, not a lazily negated/conjugated view, with an
    allocated storage that holds all of it. Kernels trust the sizes they are
    given, so every plugin checks each tensor with this before its pointer
    leaves Python (and checks shapes against each other itself)."""
    import torch  # kernels are built without torch; checking a tensor needs it

    if t is None:
        return "is missing"
    if type(t) not in (torch.Tensor, torch.nn.Parameter):  # DTensor, FakeTensor...: no plain memory to hand over
        return f"is a {type(t).__name__}, not a plain tensor"
    if t.device.type != "cpu":
        return f"is on {t.device}, not the CPU"
    if t.dtype != dtype:
        return f"is {t.dtype}, not {dtype}"
    if not t.is_contiguous():
        return "is not contiguous"
    if t.is_neg() or t.is_conj():
        return "is a lazily negated or conjugated view"
    if t.numel() == 0:
        return None
    try:
        storage = t.untyped_storage()
        backed = storage.data_ptr() != 0 and (t.storage_offset() + t.numel()) * t.element_size() <= storage.nbytes()
    except (RuntimeError, NotImplementedError):  # no storage at all
        backed = False
    return None if backed else "has no allocated storage of its size"
