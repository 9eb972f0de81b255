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

A subsystem beside the core, not part of it: no build of an optimizer goes
through here, only the plugins' own kernels do. Its parts:

- :mod:`._cache`: which cached library may be loaded (ownership, permissions,
  truncated files);
- :mod:`._compile`: compiling within one time limit, and :func:`build_c_library`;
- :mod:`._pointers`: :func:`pointer_problem`, the check every tensor passes
  before its data pointer is handed to C.
"""

from __future__ import annotations

from ._cache import cache_dir
from ._compile import DEFAULT_BUILD_TIMEOUT, build_c_library, build_timeout, compiler
from ._pointers import pointer_problem

__all__ = ["DEFAULT_BUILD_TIMEOUT", "build_c_library", "build_timeout", "cache_dir", "compiler", "pointer_problem"]
