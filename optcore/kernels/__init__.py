"""Plugins' native CPU kernels: ``.c`` files built on first use, cached, loaded with ctypes.

torch's eager ops make one pass over memory per op; an optimizer step written as
one C loop makes one pass in all, which is what gets a step close to the memory
bandwidth bound on CPU. A plugin ships its kernel as ``.c`` files in its package
(package data) and calls :func:`build_c_library`, which compiles them with the
system compiler (``$CC``, else ``cc``/``gcc``/``clang``) with warnings as
errors, caches the shared library under ``$OPTCORE_CACHE_DIR`` (else
``~/.cache/optcore``) keyed by sources, compiler, flags, machine and CPU
instruction set, and loads it with :mod:`ctypes`. No torch headers are needed,
so a build takes a fraction of a second. Where nothing can be built the plugin
runs its functional torch path, after one :class:`KernelUnavailableWarning`.

A subsystem beside the core, not part of it: no build of an optimizer goes
through here, only the plugins' own kernels do. Its parts:

- :mod:`._cache`: which cached library may be loaded (ownership, permissions,
  truncated files);
- :mod:`._compile`: compiling within one time limit, the cache key, and
  :func:`build_c_library`;
- :mod:`._pointers`: :func:`pointer_problem`, the check every tensor passes
  before its data pointer is handed to C, and :func:`overlap_problem`
  (:func:`disjoint` on raw pointers), the check that a kernel's tensors do not share memory;
- :mod:`._run`: :func:`run_kernel`, through which every C call goes with the
  scratch it declares, so that ``optcore memory`` predicts the path a CPU step
  takes (:func:`predicting`) and counts the kernel's own memory
  (:func:`counting_scratch`).
"""

from __future__ import annotations

from ._cache import cache_dir
from ._compile import (
    DEFAULT_BUILD_TIMEOUT,
    KernelUnavailableWarning,
    build_c_library,
    build_timeout,
    compiler,
    cpu_features,
)
from ._pointers import disjoint, overlap_problem, pointer_problem
from ._run import counting_scratch, is_predicting, predicting, run_kernel

__all__ = [
    "DEFAULT_BUILD_TIMEOUT",
    "KernelUnavailableWarning",
    "build_c_library",
    "build_timeout",
    "cache_dir",
    "compiler",
    "counting_scratch",
    "cpu_features",
    "disjoint",
    "is_predicting",
    "overlap_problem",
    "pointer_problem",
    "predicting",
    "run_kernel",
]
