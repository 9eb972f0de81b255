"""Which cached kernel library may be loaded, and where to build when none may.

Loading a shared library runs its constructors in this process, and the file
names are predictable. So, as ssh does for ``~/.ssh`` and pip for its cache, a
cache directory or library that is not owned by the current user, or that
group or others may write, is refused with a warning, and the library is built
in a fresh private temporary directory instead. The cache directory is created
``0700``. A cached library that is truncated is rebuilt: it is checked for
before ``dlopen`` could crash on it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import stat
import struct
import tempfile
import warnings
from pathlib import Path


def cache_dir() -> Path:
    """Where built libraries are kept (when that directory passes :func:`untrusted`)."""
    root = os.environ.get("OPTCORE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "optcore"
    )
    return Path(root)


def untrusted(path: Path, st: os.stat_result) -> str | None:
    """Why ``path`` must not be trusted, or ``None``: owned by someone else, or
    writable by group or others (they could plant or swap a library).
    Ownership is checked where there are user ids (not on Windows, where no
    kernel is built)."""
    geteuid = getattr(os, "geteuid", None)
    uid = geteuid() if geteuid is not None else st.st_uid
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_cache_dir() -> tuple[Path, str | None]:
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
    return path, untrusted(path, st)


@functools.cache
def fallback_dir() -> Path:
    """A fresh private directory for this process (``mkdtemp`` makes it ``0700``), removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="optcore-kernels-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def refuse(problem: str) -> Path:
    fallback = fallback_dir()
    warnings.warn(
        f"optcore.kernels: not loading from the kernel cache: {problem}. Building in the private "
        f"temporary directory {fallback} instead (slower: it is rebuilt in every process). "
        "Fix: make the cache yours and private (chown to you, chmod go-w; remove files you did not "
        "build), or point OPTCORE_CACHE_DIR at a directory only you can write.",
        RuntimeWarning,
        stacklevel=3,
    )
    return fallback


def existing_library(path: Path) -> tuple[bool, str | None]:
    """Whether a library is at ``path``, and why it must not be loaded (or ``None``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False, None
    if not stat.S_ISREG(st.st_mode):
        return True, f"{path} is not a regular file"
    return True, untrusted(path, st)


def truncated(path: Path) -> bool:
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

