"""Every shipped optimizer, and torch's, under the kit's placements
(``optcore.testing.check_placements``), each against one process on the full batch.

The rows of ``benchmarks/placements.py`` (which writes docs/distributed.md's
table over every placement) run here on the 2-rank placements: DDP, FSDP2,
torch ZeRO, DeepSpeed ZeRO-1/2/3 and DCP resumes 2->1 and 1->2. A
representative slice of rows runs on the wider ones: FSDP2 on 3 and 4 ranks,
HSDP 2x2, DCP 2->3, 3->2 and 4->1. A cell may be ``equal`` or ``refused`` (a
ConfigError naming why); ``differs`` and ``crashed`` are bugs, allowed only
where :data:`KNOWN` names them with the reason and the work that removes them.
KNOWN is strict: a cell in it that no longer fails fails this test until its
entry is deleted, so it only shrinks.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

import optcore
from optcore.testing import PlacementCase, PlacementReport, PlacementResult, check_placements
from optcore.testing._placements import NOISE_FACTOR

from bench_helpers import ROOT

pytestmark = pytest.mark.distributed

sys.path.insert(0, str(ROOT / "benchmarks"))  # the spawned ranks inherit it and find placements.UserSGD
import placements  # noqa: E402

TWO_RANKS = ("ddp", "fsdp2", "zero1", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "dcp-2to1", "dcp-1to2")
WIDER = ("fsdp2-3", "fsdp2-4", "hsdp-2x2", "dcp-2to3", "dcp-3to2", "dcp-4to1")
SLICE = ("AdamW", "torch:Muon + AdamW", "Adafactor (optcore-adafactor)", "AdaScaleSGD (optcore-adascale)",
         "MemoryEfficientFP16Optimizer(Lion) (optcore-fp16)")
FSDP2_CELLS = ("fsdp2", "dcp-2to1", "dcp-1to2")  # the DCP resumes run FSDP2 on the ranks

#: (row, placement) -> why it fails today; delete the entry when the named work lands
KNOWN: dict[tuple[str, str], str] = {}


def _shard_local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


class NormalisedSGD(torch.optim.Optimizer):
    """p -= lr * g / ||g|| computed on each tensor's local data (``to_local()``
    under FSDP2, as a C kernel must): a per-tensor update that declares itself
    elementwise, wrongly. The kit must find it different from one process."""

    sharding = "elementwise"

    def __init__(self, params, lr: float = 0.05) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    local, grad = _shard_local(p), _shard_local(p.grad)
                    local.sub_(group["lr"] * grad / grad.norm().clamp_min(1e-12))


class EveryFifthStepNormalised(torch.optim.Optimizer):
    """SGD, except every ``k``-th step normalises each tensor's local data (as
    Lookahead's copy every k steps is where Ranger broke): declared
    elementwise, wrongly, only at its periodic step. With ``k`` a
    hyper-parameter the kit runs three periods; hidden, 4 steps never reach it."""

    sharding = "elementwise"

    def __init__(self, params, lr: float = 0.05, k: int = 5, declare: bool = True) -> None:
        super().__init__(params, {"lr": lr, **({"k": k} if declare else {})})
        self.every, self.count = k, 0

    @torch.no_grad()
    def step(self, closure=None):
        self.count += 1
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    local, grad = _shard_local(p), _shard_local(p.grad)
                    if self.count % self.every == 0:
                        grad = grad / grad.norm().clamp_min(1e-12)
                    local.sub_(group["lr"] * grad)


LIAR = "NormalisedSGD (declared elementwise)"
PERIODIC = "every fifth step per shard, k declared"


@pytest.fixture(scope="session")
def report() -> PlacementReport:
    return check_placements(
        {**placements.CASES, LIAR: {"type": NormalisedSGD, "lr": 0.05},
         PERIODIC: {"type": EveryFifthStepNormalised, "lr": 0.05}},
        TWO_RANKS,
    )


@pytest.fixture(scope="session")
def wider() -> PlacementReport:
    return check_placements({name: placements.CASES[name] for name in SLICE}, WIDER)


def _absent(report: PlacementResult) -> bool:
    """A cell this environment cannot run: DeepSpeed or the row's plugin is not installed."""
    return report.outcome == "skipped" or (
        report.outcome == "crashed" and report.message.startswith(("one process: OptimizerNotFoundError",
                                                                   "one process: PluginLoadError"))
    )


def _row(report: PlacementReport, name: str) -> dict[str, str]:
    return {p: report[name, p].outcome for p in report.placements}


def test_no_cell_differs_from_one_process_or_crashes_except_the_known_ones(report):
    problems = {(r.optimizer, r.placement): r for r in report.problems() if r.optimizer not in (LIAR, PERIODIC) and not _absent(r)}
    unexpected = [
        f"{key}: {r.outcome} {r.max_diff}: {r.message[:400]}" for key, r in problems.items() if key not in KNOWN
    ]
    assert not unexpected, "\n".join(unexpected) + "\n\n" + report.table()
    fixed = [
        f"{key}: now {report[key].outcome} ({why})"
        for key, why in KNOWN.items()
        if key not in problems and not _absent(report[key])
    ]
    assert not fixed, "these KNOWN cells no longer fail; delete their entries:\n" + "\n".join(fixed)


def test_elementwise_optimizers_equal_one_process_everywhere(report):
    for name in ("AdamW", "Adam", "SGD (momentum)", "RMSprop", "Adagrad", "Lion (optcore-lion)"):
        cells = [report[name, p] for p in report.placements if not _absent(report[name, p])]
        assert all(c.outcome == "equal" and c.max_diff <= report.atol for c in cells), (name, _row(report, name))


def test_refusals_say_why_and_what_works_instead(report):
    refused = [r for r in report.results if r.outcome == "refused"]
    assert refused
    for r in refused:
        assert any(word in r.message for word in ("DDP", "stage 0", "elementwise", "use ", "Use ")), r


def test_a_users_class_is_refused_where_its_sharding_is_unknown_and_runs_where_it_is_whole(report):
    row = _row(report, "a user's SGD subclass")
    assert row["ddp"] == row["fsdp2"] == "equal"
    assert row["zero1"] == row["deepspeed-zero1"] == row["deepspeed-zero2"] == "refused"
    assert "sharding='unknown'" in report["a user's SGD subclass", "zero1"].message


def test_the_kit_finds_an_update_that_is_not_what_it_declares(report):
    """Under DDP the liar sees whole gradients (equal); under FSDP2 each rank
    normalises its own shard: the kit reports it as different, as a multiple
    of the row's one-process noise far above the tolerance."""
    assert report[LIAR, "ddp"].outcome == "equal"
    for p in ("fsdp2", "dcp-1to2"):
        cell = report[LIAR, p]
        assert cell.outcome == "differs" and cell.max_diff > 1e-3 and cell.multiple > 100 * NOISE_FACTOR, cell
    assert "**differs" in report.table()


def test_the_kit_runs_three_periods_of_a_declared_period_and_finds_what_only_the_period_breaks(report):
    assert report.row_steps[PERIODIC] == 15 and report.row_steps["AdamW"] == 12
    assert report[PERIODIC, "ddp"].outcome == "equal"
    assert report[PERIODIC, "fsdp2"].outcome == "differs", report[PERIODIC, "fsdp2"]


def test_four_steps_never_reach_a_hidden_fifth_step_and_twelve_do():
    """What the old 4-step kit could not see: the same optimizer with its
    period hidden says equal in 4 steps, and differs in the default 12."""
    case = {"type": EveryFifthStepNormalised, "lr": 0.05, "declare": False}
    short = check_placements({"hidden": case}, ["fsdp2"], steps=4)
    assert short["hidden", "fsdp2"].outcome == "equal" and short.row_steps["hidden"] == 4
    default = check_placements({"hidden": case}, ["fsdp2"])
    assert default["hidden", "fsdp2"].outcome == "differs", default["hidden", "fsdp2"]


def test_each_rows_tolerance_is_its_one_process_noise(report):
    """The noise is one process against itself in another summation order
    (floored at one float epsilon of the largest parameter); every judged
    cell's tolerance is NOISE_FACTOR times it, and its multiple is reported."""
    for name in report.optimizers:
        noise = report.noise[name]
        if noise is None:
            continue
        assert noise > 0
        for p in report.placements:
            cell = report[name, p]
            if cell.outcome in ("equal", "differs"):
                assert cell.noise == noise and cell.atol >= NOISE_FACTOR * noise
                assert cell.multiple == pytest.approx(cell.max_diff / noise)
    assert report.noise["FP16Optimizer(AdamW) (optcore-fp16)"] > 100 * report.noise["AdamW"]  # fp16 rounds


def test_the_wider_placements_equal_one_process(wider):
    """FSDP2 on 3 and 4 ranks (uneven and empty shards), HSDP 2x2, and DCP
    resumes across world sizes: Muon + AdamW, Adafactor, AdaScaleSGD and the
    fp16 wrapper as AdamW, each against one process standing for the same
    ranks. On HSDP, AdaScale counted each replicated shard's |g|^2 once per
    replica (6e5 times the noise off) and the wrapper's overflow vote asked a
    2-D mesh for one group (crashed)."""
    for name in SLICE:
        for p in WIDER:
            cell = wider[name, p]
            if _absent(cell):
                continue
            assert cell.outcome == "equal", (name, p, cell)


def test_memory_efficient_fp16_steps_fsdp2_shards_and_fp16optimizer_is_refused_naming_what_works(report):
    """MemoryEfficientFP16Optimizer has no copies of its own: it steps each
    rank's fp16 shard (the overflow vote is one all-reduce). FP16Optimizer's
    fp32 masters are refused at build, naming FSDP2's own mixed precision."""
    me, fp16 = "MemoryEfficientFP16Optimizer(Lion) (optcore-fp16)", "FP16Optimizer(AdamW) (optcore-fp16)"
    assert report[fp16, "ddp"].outcome == "equal"
    for p in ("ddp", *FSDP2_CELLS):
        assert report[me, p].outcome == "equal", report[me, p]
    for p in FSDP2_CELLS:
        cell = report[fp16, p]
        assert cell.outcome == "refused", cell
        assert all(w in cell.message for w in ("MixedPrecisionPolicy", "MemoryEfficientFP16Optimizer", "DDP")), cell
