"""Adafactor's step as plain C loops, for fp32 CPU tensors: the native
backend of :func:`optcore_adafactor.functional.adafactor_update`.

Written as torch ops, the update allocates about six temporaries of the
parameter's size and makes about a dozen passes over memory, and the small
ops around it (row mean, factors, RMS(U), RMS(p), ...) cost more than the
passes on small tensors. ``adafactor_step_batch`` does the whole step of many
tensors in one call: per matrix, one pass reading G (and X, for RMS(X)) for
the statistics, the O(n + m) work, and one pass reading G and X (and M) and
writing X (and M); per vector the same with a full second moment. From the
second step on, pass 1 takes RMS(X) from the sum of squares pass 2 computed
as it wrote X, and pass 2 checks it against the X it reads (see
``csrc/adafactor_fp32.c``), so
relative-step mode moves 16 bytes per element, as manual-lr mode does. Without
``scale_parameter`` RMS(X) is still stored (Hugging Face keeps it in the state),
and pass 2 adds it up from the X it reads: no pass reads X for it alone. One call
per optimizer step means one fork and join of the OpenMP threads and no
Python in between: small tensors go whole to one thread each, large ones are
split by rows over all threads (:data:`SHARED_MIN`).

Update clipping needs RMS(U) before the parameter may change, which would
be a third pass over G. It is not, because U_ij = G_ij r_i c_j with
r_i² = mean(R)/R_i and c_j² = 1/C_j, so

    sum U² = mean(R) * sum_j (sum_i G²_ij / R_i) / C_j

and the inner sums come out of pass 1 once R_i of each row is known.

The loops (``csrc/adafactor_fp32.c``) need no torch headers, so
:func:`optcore.kernels.build_c_library` builds them with the system C
compiler in well under a second on first use; the library is cached
(``$OPTCORE_CACHE_DIR``, else ``~/.cache/optcore``) and called through
:mod:`ctypes`, which releases the GIL. OpenMP threads follow
``torch.get_num_threads()``.

The loops trust the sizes they get, so every tensor is checked before its
pointer goes to C (:func:`_pointer`: plain fp32 CPU tensor, exact shape,
contiguous, storage large enough, with :func:`optcore.kernels.pointer_problem`
saying what is wrong), and nothing runs while torch.compile traces (the
tensors are then stand-ins without memory).

Where no compiler works, or with ``OPTCORE_ADAFACTOR_KERNEL=0``, :func:`load`
returns ``None`` (the reason is in :data:`unavailable_reason`) and the
functional update runs; both give the same numbers (tested).
"""

from __future__ import annotations

import ctypes
import functools
import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from optcore.kernels import build_c_library, disjoint, overlap_problem, pointer_problem, run_kernel

#: The loops' C source, shipped in the package (package data).
SOURCE = Path(__file__).parent / "csrc" / "adafactor_fp32.c"

#: Matrices of at least this many elements (8 MB of fp32) are split by rows
#: over all threads; smaller ones go whole to one thread each, which needs no
#: barrier. Pass 2 re-reads what pass 1 read, so a matrix whose p and g (16 MB
#: here) fit in each thread's share of the last-level cache is best stepped
#: by one thread, and a larger one by all, each on its own rows.
SHARED_MIN = 1 << 21

#: Why the kernel could not be built, once :func:`load` has failed.
unavailable_reason: str | None = None


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled kernels (built and cached on first call), or ``None``."""
    global unavailable_reason
    if os.environ.get("OPTCORE_ADAFACTOR_KERNEL", "1") == "0":
        unavailable_reason = "disabled by OPTCORE_ADAFACTOR_KERNEL=0"
        return None
    flag_sets = (  # -fopenmp-simd: the float reductions vectorise even without OpenMP threads
        ["-fopenmp"], ["-fopenmp", "-DNO_CLONES"], ["-fopenmp-simd", "-DNO_CLONES", "-Wno-unknown-pragmas"],
        ["-DNO_CLONES", "-Wno-unknown-pragmas"],
    )
    lib, unavailable_reason = build_c_library("adafactor_fp32", [SOURCE], flag_sets)
    if lib is not None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        lib.adafactor_step_batch.argtypes = [i64, ptr, ptr, ptr, ptr, i64, ctypes.c_int]
        lib.adafactor_step_batch.restype = ctypes.c_int
        lib.adafactor_scratch_bytes.argtypes = [i64, ptr, ctypes.c_int]
        lib.adafactor_scratch_bytes.restype = i64
    return lib


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_F32 = torch.float32
_STRIDED = torch.strided


def _problem(name: str, t: Tensor | None, shape: Sequence[int]) -> str:
    """What is wrong with ``t`` for the loops, as an error message."""
    if t is None:
        return f"Adafactor C kernel: {name} is missing."
    problem = pointer_problem(t, _F32)
    if problem is None and tuple(t.shape) != tuple(shape):
        problem = f"has shape {tuple(t.shape)}, expected {tuple(shape)}"
    if problem is None and t.numel() == 0:
        problem = "is empty"
    if problem is None:
        problem = "cannot be handed to the C loops"
    return f"Adafactor C kernel: {name} {problem}."


def _pointer(name: str, t: Tensor | None, shape: Sequence[int]) -> int | None:
    """``t``'s data pointer if the loops may use it as ``shape`` fp32 elements;
    ``None`` if it is not a plain, contiguous, non-empty fp32 CPU tensor of that
    shape (the functional update takes it instead). Raises if it is one, but its storage
    does not hold it (freed, as FSDP does with ``resize_(0)``): no path may
    read it then.

    This is :func:`optcore.kernels.pointer_problem` plus the shape, in its
    cheapest form (under 1 us; the helper takes about 4, which on the bench's
    10M parameters would be a tenth of the step): the helper still writes
    every message, and a test checks that whatever it refuses is refused here."""
    if (
        type(t) in _PLAIN and t.is_cpu and t.dtype is _F32 and t.layout is _STRIDED and t.shape == shape
        and t.is_contiguous()
        and not t.is_neg()
    ):
        numel = t.numel()
        if not numel:
            return None
        ptr = t.data_ptr()
        if ptr and t.untyped_storage().nbytes() >= (t.storage_offset() + numel) * 4:
            return ptr
        raise ValueError(
            f"{_problem(name, t, shape)[:-1]} (freed, e.g. by FSDP's resize_(0)): nothing was stepped. "
            "Step the optimizer while its tensors hold their memory."
        )
    if type(t) in _PLAIN and t.is_meta and t.numel() and t.shape == shape and pointer_problem(t, _F32) is None:
        return 0  # within optcore.kernels.predicting(): the loops would take it on the CPU, and will not run
    return None


def _require(name: str, t: Tensor | None, shape: Sequence[int]) -> int:
    """:func:`_pointer` for a tensor that must go to C: raises what is wrong instead of ``None``."""
    if torch.compiler.is_compiling():
        raise RuntimeError(
            "Adafactor C kernel called under torch.compile: it runs on real memory only (eager). "
            "This is a bug in optcore-adafactor's dispatch; set implementation='torch' to work around it."
        )
    ptr = _pointer(name, t, shape)
    if ptr is None:
        raise ValueError(_problem(name, t, shape))
    return ptr


class Batch:
    """The C jobs of one optimizer step, run together by :meth:`run` (one
    call of ``adafactor_step_batch``: see the job layout in SOURCE).

    :meth:`add` checks every tensor of a parameter (:func:`_pointer`) and
    only then records its pointers, so a refused parameter leaves nothing
    behind; nothing is written before :meth:`run`.
    """

    __slots__ = ("_lib", "dims", "ptrs", "scalars")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self.dims: list[int] = []
        self.ptrs: list[int] = []  # 0 for an absent tensor
        self.scalars: list[float] = []

    @classmethod
    def new(cls) -> Batch | None:
        """An empty batch, or ``None`` where the loops cannot run (not built,
        or torch.compile is tracing)."""
        if torch.compiler.is_compiling():
            return None
        lib = load()
        return None if lib is None else cls(lib)

    def __len__(self) -> int:
        return len(self.dims) // 2

    def add(
        self, param: Tensor, grad: Tensor, exp_avg: Tensor | None, stats: Sequence[Tensor], rms: Tensor | None,
        scalars: tuple[float, float, float, float, float, float, float, float], *, strict: bool = False,
        memo: int = 0, shape: tuple[int, ...] | None = None, scale: bool = True,
    ) -> bool:
        """Add the step of one parameter: a matrix (``stats`` = row, col
        statistics) or a vector or scalar (``stats`` = the full second moment).
        ``rms`` (the 0-dim state, or ``None``) receives RMS(X) before the
        step; with ``scale`` (scale_parameter) the step size is
        max(eps2, RMS(X)) rho, without it rho (then pass 2 adds RMS(X) up as
        it reads X: no pass reads X for it alone). ``scalars``: beta2t,
        inv_scale, eps1, eps2, rho, clip_threshold, beta1, weight_decay.
        ``memo``: the address of a matrix's two doubles that let pass 1 skip
        reading X with ``scale`` (see SOURCE; NaN and 0 to start, kept by the
        caller for the parameter), or 0. Returns whether it was added:
        ``False`` if a tensor is one the loops cannot take (with ``strict``: a
        ``ValueError`` saying why). ``shape``: ``tuple(param.shape)``, where
        the caller has it (a tuple: torch.Size compares faster with one than
        with another Size)."""
        shape = tuple(param.shape) if shape is None else shape
        check = _require if strict else _pointer
        if len(shape) == 2 and len(stats) == 2:
            dims: tuple[int, int] = shape  # type: ignore[assignment]
            x, g = check("param", param, shape), check("grad", grad, shape)
            if x is None or g is None:
                return False
            row, col = check("exp_avg_sq_row", stats[0], shape[:1]), check("exp_avg_sq_col", stats[1], shape[1:])
        elif len(shape) <= 1 and len(stats) == 1:
            dims = (param.numel(), 0)
            x, g = check("param", param, shape), check("grad", grad, shape)
            if x is None or g is None:
                return False
            row, col = check("exp_avg_sq", stats[0], shape), 0
        elif strict:
            raise ValueError(f"Adafactor C kernel: param of shape {tuple(shape)} is neither a matrix nor a vector.")
        else:
            return False
        mom = 0 if exp_avg is None else check("exp_avg", exp_avg, shape)
        rms_ptr = 0 if rms is None else check("RMS", rms, ())
        if row is None or col is None or mom is None or rms_ptr is None:
            return False
        n, m = dims
        size = 4 * n * (m or 1)
        if not disjoint(((x, size), (g, size), (mom, size), (row, 4 * n), (col, 4 * m), (rms_ptr, 4))):
            if strict:
                names = ("exp_avg_sq_row", "exp_avg_sq_col") if len(stats) == 2 else ("exp_avg_sq",)
                named = {"param": param, "grad": grad, "exp_avg": exp_avg, **dict(zip(names, stats)), "RMS": rms}
                raise ValueError(f"Adafactor C kernel: {overlap_problem(named)}.")
            return False  # the loops read them as restrict: the functional update steps tensors that alias
        self.dims.extend(dims)
        self.ptrs.extend((x, g, mom, row, col, rms_ptr, memo))
        self.scalars.extend(scalars)
        self.scalars.append(1.0 if scale else 0.0)
        return True

    def run(self, out: ctypes.Array | None = None) -> None:
        """Step every job added (nothing if none); ``out`` receives four
        doubles per job (RMS(X) before the step, step size, RMS(U), whether
        pass 1 read X)."""
        count = len(self)
        if not count:
            return
        if torch.compiler.is_compiling():
            raise RuntimeError(
                "Adafactor C kernel called under torch.compile: it runs on real memory only (eager). "
                "This is a bug in optcore-adafactor's dispatch; set implementation='torch' to work around it."
            )
        # array() copies a list in C: a ctypes array built from the same list costs ~10 us per job
        dims, ptrs, scalars = array("q", self.dims), array("Q", self.ptrs), array("d", self.scalars)
        if out is not None and len(out) < 4 * count:
            raise ValueError(f"Adafactor C kernel: out holds {len(out)} doubles, {4 * count} needed.")
        threads = torch.get_num_threads()
        status = run_kernel(
            lambda: self._lib.adafactor_step_batch(
                count, dims.buffer_info()[0], ptrs.buffer_info()[0], scalars.buffer_info()[0], out, SHARED_MIN,
                threads,
            ),
            scratch=lambda: self._lib.adafactor_scratch_bytes(count, dims.buffer_info()[0], threads),
        )
        if status not in (0, None):  # None: a prediction (optcore.kernels.predicting), which calls nothing
            raise MemoryError("Adafactor C kernel: could not allocate its scratch memory; nothing was stepped.")
