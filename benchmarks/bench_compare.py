"""The compare loop's overhead: its time per step against a plain hand-written
loop with the same optimizer, side by side in one process (target: within 5%).

    python benchmarks/bench_compare.py                      # AdamW, 300 steps, 3 rounds
    python benchmarks/bench_compare.py --optimizer optcore-lion:Lion --steps 200

Both loops train the char-lm task's model from the same weights on the same
batches with an optimizer built by ``optcore.build_optimizer`` from the same
config, on one thread. The plain loop is what a user writes (next batch,
zero_grad, forward, loss, backward, step). The compare loop is
``optcore.compare.train.run_config`` with its defaults (10 held-out evaluations
included); its per-step time is read from its progress callback. Rounds
alternate the two loops; each gets its best round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import optcore
from optcore.compare.tasks import load_task
from optcore.compare.train import RunSettings, run_config


def plain_loop(config: dict, steps: int, seed: int = 0) -> float:
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
        float(loss)  # the loop reads the loss, as compare's does
        stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def compare_loop(config: dict, steps: int, seed: int = 0) -> tuple[float, float]:
    """Seconds per step of compare's loop: (mean incl. its evaluations, median step)."""
    stamps: list[float] = []
    result = run_config({"name": "bench", "optimizer": dict(config)}, RunSettings(steps=steps, seed=seed),
                        lambda step, loss, lr: stamps.append(time.perf_counter()))  # fmt: skip
    assert result["status"] == "ok", result["error"]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", default="torch:AdamW")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = {"type": args.optimizer, "lr": args.lr}
    plain, mean, median = [], [], []
    for _ in range(args.rounds):
        plain.append(plain_loop(config, args.steps))
        m, med = compare_loop(config, args.steps)
        mean.append(m)
        median.append(med)
    best = min(plain)
    print(f"{args.optimizer} lr={args.lr}, char-lm, {args.steps} steps, best of {args.rounds} rounds, 1 thread")
    print(f"  plain loop            {1e3 * best:7.2f} ms/step")
    print(f"  compare loop (median) {1e3 * min(median):7.2f} ms/step   ratio {min(median) / best:.3f}")
    print(f"  compare loop (mean)   {1e3 * min(mean):7.2f} ms/step   ratio {min(mean) / best:.3f}  "
          "(includes its 10 held-out evaluations)")  # fmt: skip


if __name__ == "__main__":
    main()
