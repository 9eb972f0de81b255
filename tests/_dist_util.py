"""Run a function on every rank of a real gloo process group over loopback.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` processes (the
``spawn`` start method, as ``torch.multiprocessing.spawn``), each joining a
gloo group on 127.0.0.1 at a free port, calls ``fn(rank, world_size, *args)``
and returns the ranks' return values. Nothing can stall CI:

* a rank that raises or dies is reported with its traceback or exit code;
  its peers fail on their own (gloo sees the closed connection) and are killed
  if they have not ``grace`` seconds later;
* at ``timeout`` every rank still running is killed and reported as hung.

Failures raise :class:`RanksFailed`, an ``AssertionError``, so pytest shows
them as test failures with every rank's story.
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing.connection
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


class RanksFailed(AssertionError):
    """One or more ranks raised, died or hung; ``failures`` maps rank -> what happened."""

    def __init__(self, failures: dict[int, str]) -> None:
        self.failures = failures
        super().__init__(
            "\n".join(f"--- rank {rank}: {text}" for rank, text in sorted(failures.items()))
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, outdir: str, timeout: float, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)  # ranks share two cores
    out = Path(outdir)
    crash_log = open(out / f"{rank}.crash", "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.enable(crash_log)  # a segfault still leaves a Python stack
    try:
        torch.distributed.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout)
        )
        result = fn(rank, world_size, *args)
        torch.save(result, out / f"{rank}.pt")
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent
        (out / f"{rank}.err").write_text(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)  # no atexit/destructors: a broken group must not block the exit
    torch.distributed.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0, grace: float = 20.0
) -> list[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, ...)]``, each run in its
    own process of one gloo group; ``fn`` must be importable (module level)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="optcore-dist-") as outdir:
        port = free_port()
        procs = [
            ctx.Process(target=_entry, args=(rank, world_size, port, outdir, timeout, fn, args), daemon=True)
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        start = time.monotonic()
        deadline, first_failure = start + timeout, None
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = now
            limit = deadline if first_failure is None else min(deadline, first_failure + grace)
            if now >= limit:
                break
            multiprocessing.connection.wait([p.sentinel for p in procs if p.is_alive()], timeout=limit - now)
        failures: dict[int, str] = {}
        for rank, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                p.join(5)
                why = "after another rank failed" if first_failure is not None else "at the deadline"
                failures[rank] = f"hung: killed {time.monotonic() - start:.0f} s after start, {why} (timeout {timeout:.0f} s)"
                continue
            err = Path(outdir, f"{rank}.err")
            if err.exists():
                failures[rank] = "raised:\n" + err.read_text()
            elif p.exitcode != 0:
                crash = Path(outdir, f"{rank}.crash").read_text().strip()
                failures[rank] = f"died with exit code {p.exitcode}" + (f":\n{crash}" if crash else " (killed, no traceback)")
        if failures:
            raise RanksFailed(failures)
        return [torch.load(Path(outdir, f"{rank}.pt"), weights_only=False) for rank in range(world_size)]
