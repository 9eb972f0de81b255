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
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # every rank is done with every collective
        code = 0
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent
        (out / f"{rank}.err").write_text(traceback.format_exc())
        code = 1
    # Skip interpreter teardown either way: a broken group must not block the exit,
    # and gloo's threads can abort a normal one ("terminate called without an
    # active exception", see pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    grace: float = 20.0,
    meanwhile: Callable[[], Any] | None = None,
) -> list[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, ...)]``, each run in its
    own process of one gloo group; ``fn`` must be importable (module level).
    ``meanwhile()`` runs in this process while the ranks start (they spend
    seconds importing); if it raises, the ranks are killed."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="optcore-dist-") as outdir:
        port = free_port()
        procs = [
            ctx.Process(target=_entry, args=(rank, world_size, port, outdir, timeout, fn, args), daemon=True)
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                for p in procs:
                    p.kill()
                    p.join(5)
                raise
        start = time.monotonic()
        deadline, first_failure = start + timeout, None
        # Poll exit codes: a process's sentinel can become readable before it has
        # exited (or stay unreadable after), so it cannot be waited on reliably.
        while any(p.exitcode is None for p in procs):
            now = time.monotonic()
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = now
            if now >= (deadline if first_failure is None else min(deadline, first_failure + grace)):
                break
            time.sleep(0.1)
        failures: dict[int, str] = {}
        for rank, p in enumerate(procs):
            if p.exitcode is None:
                p.kill()
                p.join(5)
                why = "after another rank failed" if first_failure is not None else "at the deadline"
                elapsed = time.monotonic() - start
                failures[rank] = f"hung: killed {elapsed:.0f} s after start, {why} (timeout {timeout:.0f} s)"
                continue
            err = Path(outdir, f"{rank}.err")
            if err.exists():
                failures[rank] = "raised:\n" + err.read_text()
            elif p.exitcode != 0:
                crash_file = Path(outdir, f"{rank}.crash")
                if not crash_file.exists():
                    detail = " before it could start (see the captured stderr)"
                else:
                    crash = crash_file.read_text().strip()  # faulthandler's stack of a fatal signal
                    detail = f":\n{crash}" if crash else " without a Python traceback (os._exit, or killed)"
                failures[rank] = f"died with exit code {p.exitcode}{detail}"
        if failures:
            raise RanksFailed(failures)
        return [torch.load(Path(outdir, f"{rank}.pt"), weights_only=False) for rank in range(world_size)]
