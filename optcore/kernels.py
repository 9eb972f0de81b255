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
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_c_library", "cache_dir", "compiler"]


def cache_dir() -> Path:
    """Where built libraries are kept."""
    root = os.environ.get("OPTCORE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "optcore"
    )
    return Path(root)


def compiler() -> str | None:
    """The C compiler to use, or ``None``."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _compile(cc: str, source: str, flags: Sequence[str], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, f"{out.stem}.c")
        src.write_text(source)
        built = Path(tmp, f"{out.stem}.so")
        subprocess.run([cc, *flags, str(src), "-o", str(built)], check=True, capture_output=True, timeout=120)
        fd, staged = tempfile.mkstemp(dir=out.parent, suffix=".so")  # same filesystem: atomic rename
        os.close(fd)
        shutil.copyfile(built, staged)
        os.replace(staged, out)


def build_c_library(
    name: str,
    source: str,
    flag_sets: Sequence[Sequence[str]] = (("-O3", "-shared", "-fPIC", "-fopenmp"), ("-O3", "-shared", "-fPIC")),
) -> tuple[ctypes.CDLL | None, str | None]:
    """Build (or reuse) ``source`` as a shared library and load it.

    ``flag_sets`` are tried in order (e.g. with OpenMP, then without); the first
    that compiles and loads wins. Returns ``(library, None)`` or ``(None, reason)``.
    """
    cc = compiler()
    if cc is None:
        return None, "no C compiler found (set CC or install gcc/clang)"
    errors = []
    for flags in flag_sets:
        key = hashlib.sha256("\0".join([source, cc, *flags, platform.machine()]).encode()).hexdigest()[:16]
        path = cache_dir() / f"{name}_{key}.so"
        try:
            if not path.exists():
                _compile(cc, source, flags, path)
            return ctypes.CDLL(str(path)), None
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            errors.append(f"{cc} {' '.join(flags)}: {exc} {detail.decode(errors='replace')[:300]}".strip())
    return None, "; ".join(errors)
