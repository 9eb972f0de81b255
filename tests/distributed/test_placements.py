"""Every shipped optimizer, and torch's, under every placement of the kit
(``optcore.testing.check_placements``): DDP, FSDP2, torch ZeRO, DeepSpeed ZeRO-1/2
and DCP resume across world sizes, each against one process on the full batch.

One 2-rank gloo group runs the whole table once per session (the rows of
``benchmarks/placements.py``, which also writes docs/distributed.md's table).
A cell may be ``equal`` or ``refused`` (a ConfigError naming why); ``differs``
and ``crashed`` are bugs, allowed only where :data:`KNOWN` names them with the
reason and the work that removes them. KNOWN is strict: a cell in it that no
longer fails fails this test until its entry is deleted, so it only shrinks.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

import optcore
from optcore.testing import PlacementCase, PlacementReport, PlacementResult, check_placements

from bench_helpers import ROOT

pytestmark = pytest.mark.distributed

sys.path.insert(0, str(ROOT / "benchmarks"))  # the spawned ranks inherit it and find placements.UserSGD
import placements  # noqa: E402

FSDP2_CELLS = ("fsdp2", "dcp-2to1", "dcp-1to2")  # the DCP resumes run FSDP2 on the ranks

#: (row, placement) -> why it fails today; delete the entry when the named work lands
KNOWN: dict[tuple[str, str], str] = {}


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
                    local, grad = (t.to_local() if hasattr(t, "to_local") else t for t in (p, p.grad))
                    local.sub_(group["lr"] * grad / grad.norm().clamp_min(1e-12))


LIAR = "NormalisedSGD (declared elementwise)"


@pytest.fixture(scope="session")
def report() -> PlacementReport:
    return check_placements({**placements.CASES, LIAR: {"type": NormalisedSGD, "lr": 0.05}})


def _absent(report: PlacementResult) -> bool:
    """A cell this environment cannot run: DeepSpeed or the row's plugin is not installed."""
    return report.outcome == "skipped" or (
        report.outcome == "crashed" and report.message.startswith(("one process: OptimizerNotFoundError",
                                                                   "one process: PluginLoadError"))
    )


def _row(report: PlacementReport, name: str) -> dict[str, str]:
    return {p: report[name, p].outcome for p in report.placements}


def test_no_cell_differs_from_one_process_or_crashes_except_the_known_ones(report):
    problems = {(r.optimizer, r.placement): r for r in report.problems() if r.optimizer != LIAR and not _absent(r)}
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
    normalises its own shard: the kit reports it as different, with the size."""
    assert report[LIAR, "ddp"].outcome == "equal"
    for p in ("fsdp2", "dcp-1to2"):
        cell = report[LIAR, p]
        assert cell.outcome == "differs" and cell.max_diff > 1e-3, cell
    assert "**differs" in report.table()


def test_the_committed_support_table_has_todays_outcomes(report):
    """docs/results/placements.json (rendered into docs/distributed.md) has the
    outcomes this run found: rerun benchmarks/placements.py when one changes."""
    committed = PlacementReport.from_dict(json.loads((ROOT / "docs" / "results" / "placements.json").read_text()))
    assert committed.optimizers == tuple(placements.CASES) and committed.placements == report.placements
    stale = [
        f"{name} / {p}: committed {committed[name, p].outcome}, now {report[name, p].outcome}"
        for name in committed.optimizers for p in committed.placements
        if committed[name, p].outcome != report[name, p].outcome and not _absent(report[name, p])
    ]
    assert not stale, "run `python benchmarks/placements.py --json docs/results/placements.json` and " \
        "`python docs/figures.py`:\n" + "\n".join(stale)


def test_the_report_round_trips_and_renders(report):
    again = PlacementReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    table = report.table().splitlines()
    assert table[0].startswith("| optimizer | ddp | fsdp2 |") and len(table) == 2 + len(report.optimizers)
    with pytest.raises(ValueError, match="unknown placements"):
        check_placements({"SGD": "SGD"}, ["fsdp3"])
    assert isinstance(optcore.testing.PlacementCase("SGD"), PlacementCase)


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
