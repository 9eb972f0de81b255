"""Run one config, here or in a fresh process.

A fresh process (multiprocessing "spawn") per run makes its peak memory its
own and keeps one config from disturbing the next (allocator caches, threads,
a crash); in-process runs start faster and reset the kernel's peak-RSS mark
between configs instead.

The compare models are small and train on one thread, so on a machine with
several cores one run at a time leaves the others idle: a worker of
:mod:`.study` keeps up to ``jobs`` trials running, each in its own fresh
process (one per core by default, see :func:`default_jobs`). The numbers do
not change (each run is seeded and single-threaded, tested); steps/s is then
measured with the other cores busy, alike for every run.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queues
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from .train import RunSettings, empty_result, run_config


def run_one(
    entry: dict[str, Any],
    settings: RunSettings,
    isolate: bool = True,
    threads: int | None = 1,
    report: Callable[[int, float], None] | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Run one entry (in a fresh process with ``isolate``); ``report(step, loss)``
    follows the training loss. Never raises for a bad config: the result says
    ``failed``. KeyboardInterrupt propagates (the caller keeps what finished);
    setting ``stop`` ends an isolated run early (its process is terminated)."""
    on_step = report or (lambda step, loss: None)
    if isolate:
        return _run_isolated(entry, settings, threads, on_step, stop)
    return _run_here(entry, settings, threads, lambda step, loss, lr: on_step(step, loss))


def _run_here(entry: dict[str, Any], settings: RunSettings, threads: int | None, report: Callable[..., None]) -> dict[str, Any]:
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return run_config(entry, settings, report)
    finally:
        torch.set_num_threads(before)


def _exit_with(parent: int) -> None:
    """End this process when ``parent`` is gone (killed: SIGKILL leaves a daemon child
    running), so that a killed worker's run stops taking a core; its trial is run
    again by another worker."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _worker(entry: dict[str, Any], settings: RunSettings, threads: int | None, channel: Any, parent: int = 0) -> None:
    """Body of the per-run process: run, stream progress, send the result."""
    if parent:
        threading.Thread(target=_exit_with, args=(parent,), name="optcore-parent-watch", daemon=True).start()
    every = max(1, settings.steps // 100)

    def report(step: int, loss: float, *_: Any) -> None:
        if step % every == 0 or step == settings.steps:
            channel.put(("step", step, loss))

    try:
        result = _run_here(entry, settings, threads, report)
    except BaseException as exc:  # noqa: BLE001 - anything reaches the parent as a failed config
        result = empty_result(entry)
        result["status"], result["error"] = "failed", f"{type(exc).__name__}: {exc}"
    channel.put(("done", result))


def _run_isolated(
    entry: dict[str, Any], settings: RunSettings, threads: int | None, report: Callable[..., None],
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    channel = ctx.Queue()
    process = ctx.Process(target=_worker, args=(entry, settings, threads, channel, os.getpid()), daemon=True)
    process.start()
    result = None
    try:
        while result is None and not (stop is not None and stop.is_set()):
            try:
                message = channel.get(timeout=0.2)
            except queues.Empty:
                if not process.is_alive() and channel.empty():
                    break
                continue
            if message[0] == "step":
                report(message[1], message[2])
            else:
                result = message[1]
        if result is not None or not process.is_alive():  # else stopped: terminated below
            process.join(timeout=30)
    finally:
        if process.is_alive():
            process.terminate()
            process.join()
    if result is None:
        result = empty_result(entry)
        result["status"] = "failed"
        result["error"] = f"the worker process exited with code {process.exitcode} before reporting"
    return result


def default_jobs(threads: int | None, device: str, in_process: bool) -> int:
    """Runs at a time when the user does not say: one per core this process may
    use, divided by the threads each run takes; one for in-process runs, on an
    accelerator (they would share it), or when a run takes every core (``threads``
    0 or None: torch's default)."""
    if in_process or not device.startswith("cpu") or not threads:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // threads)
