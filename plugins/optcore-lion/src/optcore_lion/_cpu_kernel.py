"""A one-pass Lion kernel for fp32 CPU tensors: ``csrc/lion_fp32.c``, built on first use.

On CPU the Lion step is memory bound. Written as torch ops it makes six passes
over memory (one per op); this kernel reads ``p, g, m`` once and writes ``p, m``
once, which is what a step costs at the bandwidth limit. It needs no torch
headers, so :func:`optcore.kernels.build_c_library` builds it with the system C
compiler in well under a second; the shared library is cached
(``$OPTCORE_CACHE_DIR``, else ``~/.cache/optcore``) and loaded with
:mod:`ctypes`, which releases the GIL during the call. OpenMP threads
follow ``torch.get_num_threads()`` (the same ``libgomp`` torch already loaded).

Where no compiler works, :func:`load` returns ``None`` and says why in
:data:`unavailable_reason`; Lion then runs its eager path.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from optcore.kernels import build_c_library, disjoint, overlap_problem, pointer_problem, run_kernel
from torch import Tensor

#: The kernel's C source, shipped in the package (package data).
SOURCE = Path(__file__).parent / "csrc" / "lion_fp32.c"

_PARALLEL_MIN = 1 << 16  # elements per step below which one thread is faster

#: Tried in order: OpenMP threads and one clone per vector unit; without the
#: clones (a toolchain without ifunc); without threads. Never a fused
#: multiply-add the source does not write, so every element rounds alike
#: wherever it falls in the vector loop (a flat parameter steps bit for bit as
#: its pieces do).
_FLAG_SETS = tuple(
    (*flags, "-ffp-contract=off")
    for flags in (("-fopenmp",), ("-fopenmp", "-DNO_CLONES"), ("-DNO_CLONES", "-Wno-unknown-pragmas"))
)

#: Why the kernel could not be built, once :func:`load` has failed.
unavailable_reason: str | None = None


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled kernel (built and cached on first call), or ``None``."""
    global unavailable_reason
    lib, unavailable_reason = build_c_library("lion_fp32", [SOURCE], _FLAG_SETS)
    if lib is not None:
        P = ctypes.POINTER(ctypes.c_void_p)
        f = ctypes.c_float
        i64 = ctypes.c_int64
        lib.lion_fp32.argtypes = [i64, P, P, P, ctypes.POINTER(i64), f, f, f, f, f, f, ctypes.c_int]
        lib.lion_fp32.restype = None
    return lib


def _tensor_problem(t: Tensor) -> str | None:
    """Why the kernel cannot read or write ``t``, or ``None``."""
    return pointer_problem(t, torch.float32)


def problem(*tensors: Tensor) -> str | None:
    """Why the kernel cannot take these tensors (parameter, gradient, momentum),
    or ``None``: each must be plain, fp32, on CPU, contiguous, with real storage
    behind it, and no two may share memory (the loop reads them as ``restrict``;
    ``p.grad = p.detach()`` goes to torch ops)."""
    for role, t in zip(("parameter", "gradient", "momentum"), tensors):
        reason = _tensor_problem(t)
        if reason:
            return f"the {role} {reason}"
    return _overlap(tensors)


def _overlap(tensors: tuple[Tensor, ...] | list[Tensor]) -> str | None:
    """:func:`optcore.kernels.overlap_problem` of a triple; the message is built only when they overlap."""
    if disjoint((t.data_ptr(), t.numel() * t.element_size()) for t in tensors):
        return None
    return overlap_problem(dict(zip(("parameter", "gradient", "momentum"), tensors)))


def shard_problem(*tensors: Tensor) -> str | None:
    """Why the kernel cannot step the local shards of these DTensors (FSDP2's
    parameter, gradient and momentum), or ``None``: they must share one mesh
    and one placement, each ``Shard(0)`` or ``Replicate()``. Then each rank's
    local tensors are the same slice of each, of one shape, and an elementwise
    update over them is the update of the whole tensor. Plain tensors: ``None``."""
    plain = [type(t) in (Tensor, torch.nn.Parameter) for t in tensors]
    if all(plain):
        return None
    if any(plain) or not all(hasattr(t, "placements") and hasattr(t, "device_mesh") for t in tensors):
        return "it mixes DTensors with other tensors (" + ", ".join(type(t).__name__ for t in tensors) + ")"
    first = tensors[0]
    if any(t.device_mesh != first.device_mesh or tuple(t.placements) != tuple(first.placements) for t in tensors):
        return "its gradient or momentum is placed otherwise than the parameter (" + ", ".join(
            str(tuple(t.placements)) for t in tensors) + ")"
    if not all(pl.is_replicate() or pl.is_shard(0) for pl in first.placements):
        return f"it is a DTensor placed {tuple(first.placements)}, and the kernel steps Shard(0) and Replicate() only"
    return None


def local_shards(*tensors: Tensor) -> tuple[Tensor, ...] | None:
    """What the kernel steps for these tensors: themselves when plain, each
    rank's local shard (``to_local()``, which shares the DTensor's memory) when
    :func:`shard_problem` passes, else ``None`` (torch ops step them)."""
    if shard_problem(*tensors) is not None:
        return None
    return tuple(t if type(t) in (Tensor, torch.nn.Parameter) else t.to_local() for t in tensors)


def _shape_problem(p: Tensor, g: Tensor, m: Tensor) -> str | None:
    if p.shape == g.shape == m.shape:
        return None  # the kernel reads and writes numel(p) elements of each: a smaller g or m would be overrun
    return (f"has parameter shape {tuple(p.shape)}, gradient shape {tuple(g.shape)} and momentum shape "
            f"{tuple(m.shape)}; they must be equal")


class Batch:
    """The ``(p, g, m)`` triples of one step that the kernel may touch, run by
    :meth:`run` in one call. :meth:`add` checks each triple (:func:`problem`,
    and one shape for all three) and only then records it: the kernel never
    runs on tensors that were not checked, and each is checked once."""

    __slots__ = ("params", "grads", "exp_avgs")

    def __init__(self) -> None:
        self.params: list[Tensor] = []
        self.grads: list[Tensor] = []
        self.exp_avgs: list[Tensor] = []

    def __len__(self) -> int:
        return len(self.params)

    def add(self, p: Tensor, g: Tensor, m: Tensor, *, strict: bool = False) -> bool:
        """Record the triple if the kernel may step it; else ``False`` (with
        ``strict``: a ``ValueError`` saying why)."""
        reason = problem(p, g, m) or _shape_problem(p, g, m)
        if reason is not None:
            if strict:
                raise ValueError(f"Lion kernel: tensor {len(self)}: {reason}")
            return False
        self.params.append(p)
        self.grads.append(g)
        self.exp_avgs.append(m)
        return True

    def run(self, *, lr: float, weight_decay: float, beta1: float, beta2: float, gscale: float) -> None:
        """Step every triple added, in place (nothing if none)."""
        n = len(self)
        if n == 0:
            return
        lib = load()
        if lib is None:
            raise RuntimeError(f"the Lion CPU kernel is unavailable: {unavailable_reason}")
        pointers = [(ctypes.c_void_p * n)(*[t.data_ptr() for t in ts]) for ts in (self.params, self.grads, self.exp_avgs)]
        sizes = [p.numel() for p in self.params]
        threads = torch.get_num_threads() if sum(sizes) >= _PARALLEL_MIN else 1  # waking threads costs more
        counts = (ctypes.c_int64 * n)(*sizes)
        run_kernel(  # one pass, in place: the loop allocates nothing
            lambda: lib.lion_fp32(
                n, *pointers, counts, float(lr), 1.0 - float(lr) * weight_decay,
                beta1, (1.0 - beta1) * gscale, beta2, (1.0 - beta2) * gscale, threads,
            ),
            scratch=0,
        )


def lion_fp32_(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
    *, lr: float, weight_decay: float, beta1: float, beta2: float, gscale: float,
) -> None:
    """Run the kernel over ``(p, g, m)`` triples (in place) if every one passes
    :meth:`Batch.add`'s checks; else ``ValueError`` naming the first that does
    not, before anything is written."""
    if not len(params) == len(grads) == len(exp_avgs):
        raise ValueError(f"Lion kernel: {len(params)} parameters, {len(grads)} gradients, {len(exp_avgs)} momenta")
    batch = Batch()
    for p, g, m in zip(params, grads, exp_avgs):
        batch.add(p, g, m, strict=True)
    batch.run(lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2, gscale=gscale)
