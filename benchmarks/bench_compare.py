"""The compare loop's overhead: its time per step against a plain hand-written
loop with the same optimizer, side by side in one process (target: within 5%).

    python benchmarks/bench_compare.py                      # AdamW, 300 steps, 3 rounds
    python benchmarks/bench_compare.py --optimizer optcore-lion:Lion --steps 200

Both loops train the char-lm task's model from the same weights on the same
batches with an optimizer built by ``optcore.build_optimizer`` from the same
config, on one thread. The plain loop is what a user writes (next batch,
zero_grad, forward, loss, backward, step). The compare loop is
``optcore.compare.train.run_config`` with its defaults (10 held-out evaluations
included); its per-step time is read from its progress callback. Time is the
CPU time of the training thread (``time.thread_time``; torch runs on that one
thread), which a busy shared machine disturbs far less than wall time; the
wall-time ratio is printed too. Rounds alternate which loop goes first; each
loop gets its best round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import optcore
from optcore.compare.tasks import load_task
from optcore.compare.train import RunSettings, run_config


def plain_loop(config: dict, steps: int, seed: int = 0) -> tuple[float, float, float]:
    """Seconds per step of the hand-written loop (the first step, which allocates the state, excluded)."""
    task = load_task("char-lm")
    torch.manual_seed(seed)
    model = task.model()
    optimizer = optcore.build_optimizer(dict(config), model)
    batches = task.batches(seed)
    stamps = []
    for _ in range(steps):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        float(loss.detach())  # the loop reads the loss, as compare's does
        stamps.append((time.thread_time(), time.perf_counter()))
    return _per_step(stamps)


def _per_step(stamps: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(CPU s/step, wall s/step, median CPU s/step) from per-step stamps, the first step excluded."""
    n = len(stamps) - 1
    gaps = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])]
    return (stamps[-1][0] - stamps[0][0]) / n, (stamps[-1][1] - stamps[0][1]) / n, statistics.median(gaps)


def compare_loop(config: dict, steps: int, seed: int = 0) -> tuple[float, float, float]:
    """Seconds per step of compare's loop, its 10 held-out evaluations included."""
    stamps: list[tuple[float, float]] = []
    result = run_config({"name": "bench", "optimizer": dict(config)}, RunSettings(steps=steps, seed=seed),
                        lambda step, loss, lr: stamps.append((time.thread_time(), time.perf_counter())))  # fmt: skip
    assert result["status"] == "ok", result["error"]
    return _per_step(stamps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", default="torch:AdamW")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = {"type": args.optimizer, "lr": args.lr}
    runs: dict[str, list[tuple[float, float, float]]] = {"plain": [], "compare": []}
    for r in range(args.rounds):
        order = ("plain", "compare") if r % 2 == 0 else ("compare", "plain")
        for name in order:
            runs[name].append((plain_loop if name == "plain" else compare_loop)(config, args.steps))
    best = {name: [min(v[i] for v in values) for i in range(3)] for name, values in runs.items()}
    (p_cpu, p_wall, p_med), (c_cpu, c_wall, c_med) = best["plain"], best["compare"]
    print(f"{args.optimizer} lr={args.lr}, char-lm, {args.steps} steps, best of {args.rounds} rounds, 1 thread")
    print(f"  plain loop    {1e3 * p_cpu:7.2f} ms/step CPU ({1e3 * p_med:.2f} median)  {1e3 * p_wall:7.2f} ms/step wall")
    print(f"  compare loop  {1e3 * c_cpu:7.2f} ms/step CPU ({1e3 * c_med:.2f} median)  {1e3 * c_wall:7.2f} ms/step wall")
    print(f"  ratio compare/plain: CPU {c_cpu / p_cpu:.3f} (evaluations included), median step {c_med / p_med:.3f}, "
          f"wall {c_wall / p_wall:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
