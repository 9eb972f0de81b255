"""The kit's placement dimension: :func:`check_placements`.

Every optimizer trains the kit's problem (:mod:`._placement_runs`: a
miniature transformer block with uneven and empty shards) under each
placement on spawned gloo ranks, each rank on its share of the batch, and is
compared with ONE process stepping the full batch, never with another sharded
run (gloo's ``AVG`` has summed instead of averaged in some torch versions, so
two sharded runs can agree and both be wrong).

**What "equal" means.** A sharded run sums its gradients in another order than
one process, so their parameters differ in the last bits, and an optimizer
that amplifies such bits (Muon's Newton–Schulz iteration, Lion's sign) shows
more of it. Each row's tolerance therefore comes from that optimizer's own
noise: one process against itself with another summation order (the batch as
two accumulated halves, the second first). A cell is ``equal`` when its
largest difference is at most :data:`NOISE_FACTOR` times that noise (a noise
below :data:`EPS_FLOOR` float epsilons of the largest parameter counts as
that floor), and the table reports every difference as a multiple of it.

**Enough steps.** Each row runs :data:`STEPS` steps, or three periods of
the optimizer's periodic code where it declares one (a ``period`` attribute,
or a hyper-parameter of :data:`PERIOD_KEYS`: Lookahead's ``k``, a
preconditioner's update interval), so the code that runs every k-th step runs,
before and after a DCP resume.

Each cell ends in one of:

* ``equal``: the parameters match the one process within the row's tolerance;
* ``refused``: a :class:`~optcore.ConfigError` said why and what works
  instead (the message is kept);
* ``differs``: it ran and its parameters are not those of one process: a
  bug, the thing this kit exists to find;
* ``crashed``: anything else was raised (the error is kept);
* ``skipped``: the placement cannot run here (DeepSpeed not installed).

Placements (:data:`PLACEMENTS`):

* ``ddp`` on 2 ranks;
* ``fsdp2`` (2 ranks, ``fully_shard`` per unit and the root, each call with a
  mesh of its own, as docs/distributed.md writes it), ``fsdp2-3`` and
  ``fsdp2-4`` (3 and 4 ranks on one shared mesh: uneven and empty shards);
* ``hsdp-2x2``: 4 ranks, replicated over one mesh dimension and sharded over
  the other;
* ``zero1`` (:func:`optcore.distributed.zero_redundancy` under DDP);
* ``deepspeed-zero1``, ``-zero2``, ``-zero3``: the real DeepSpeed on its CPU
  accelerator through :mod:`optcore.integrations.deepspeed`, no clipping;
* ``dcp-2to1``, ``dcp-1to2``, ``dcp-2to3``, ``dcp-3to2``, ``dcp-4to1``: half the
  steps on FSDP2 ranks (or one process), saved with
  ``torch.distributed.checkpoint``, the rest resumed at the other world size.

The placements of one world size run in one spawned process group per round
(a resume's second half is the second round), so a table of many optimizers
costs five spawns.
"""

from __future__ import annotations

import importlib.metadata
import math
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from . import _placement_runs as runs
from ._ranks import run_ranks

PLACEMENTS = tuple(runs.STAGES)
OUTCOMES = ("equal", "refused", "differs", "crashed", "skipped")
STEPS = 12
#: hyper-parameters (in the optimizer's defaults, its groups or its attributes) that name a period in steps
PERIOD_KEYS = ("period", "k", "lookahead_k", "update_freq", "update_interval", "precondition_frequency",
               "preconditioner_update_interval")
NOISE_FACTOR = 10.0
EPS_FLOOR = 1.0
ROWS = runs.ROWS


@dataclass(frozen=True)
class PlacementCase:
    """One optimizer for :func:`check_placements`.

    ``config`` is what ``optcore.build_optimizer`` takes (a mapping with
    ``type``: a name, a dotted path or a class). ``dtype`` is the model's
    (``"float16"`` for the precision wrappers). ``steps`` overrides the row's
    number of steps. The one process steps with ``reference_config``
    (default: ``config``; a callable takes the number of ranks it stands for
    and returns the config), accumulating the full batch as ``micro_batches``
    backward passes of ``1 / micro_batches`` of the loss (``"world"``: one per
    rank): an optimizer that measures its gradients' spread (AdaScale) needs
    the same number of samples per step as the sharded run's ranks give it.
    ``atol`` raises the row's tolerance to at least this much.
    """

    config: Any
    dtype: str = "float32"
    atol: float | None = None
    reference_config: Any = None
    micro_batches: int | str = 1
    steps: int | None = None

    def reference(self, world: int) -> tuple[Any, int]:
        """(the one process's config, its micro-batches) standing for ``world`` ranks."""
        config = self.reference_config
        config = self.config if config is None else config(world) if callable(config) else config
        return config, world if self.micro_batches == "world" else int(self.micro_batches)


@dataclass(frozen=True)
class PlacementResult:
    optimizer: str
    placement: str
    outcome: str
    max_diff: float | None = None
    message: str = ""
    atol: float | None = None  # the tolerance the difference was judged by
    noise: float | None = None  # the row's one-process noise: the unit of the reported multiple

    @property
    def multiple(self) -> float | None:
        """The difference from one process as a multiple of the row's noise."""
        if self.max_diff is None or not self.noise:
            return None
        return self.max_diff / self.noise

    def short(self) -> str:
        """The table's cell."""
        multiple = self.multiple
        if self.outcome in ("equal", "differs") and multiple is not None:
            text = f"{self.outcome} ({multiple:.2g}x)" if math.isfinite(multiple) else f"{self.outcome} (nan)"
        else:
            text = self.outcome
        return f"**{text}**" if self.outcome in ("differs", "crashed") else text


@dataclass(frozen=True)
class PlacementReport:
    """What :func:`check_placements` found: one :class:`PlacementResult` per
    (optimizer, placement). ``str(report)`` is the table and every message.
    ``steps`` is the default number of steps, ``row_steps`` each row's and
    ``noise`` each row's one-process noise."""

    optimizers: tuple[str, ...]
    placements: tuple[str, ...]
    results: tuple[PlacementResult, ...]
    steps: int
    atol: float  # NOISE_FACTOR: a cell is equal within this many times its row's noise
    environment: dict[str, str] = field(default_factory=dict)
    row_steps: dict[str, int] = field(default_factory=dict)
    noise: dict[str, float | None] = field(default_factory=dict)

    def __getitem__(self, key: tuple[str, str]) -> PlacementResult:
        for r in self.results:
            if (r.optimizer, r.placement) == key:
                return r
        raise KeyError(key)

    def problems(self) -> list[PlacementResult]:
        """The cells that differ from one process or crashed."""
        return [r for r in self.results if r.outcome in ("differs", "crashed")]

    def table(self) -> str:
        """A Markdown table: one row per optimizer (its steps and noise), one column per placement."""
        head = "| optimizer | steps | noise | " + " | ".join(self.placements) + " |"
        lines = [head, "|---" * (len(self.placements) + 3) + "|"]
        for name in self.optimizers:
            noise = self.noise.get(name)
            cells = " | ".join(self[name, p].short() for p in self.placements)
            lines.append(f"| {name} | {self.row_steps.get(name, self.steps)} | "
                         f"{'-' if noise is None else f'{noise:.1e}'} | {cells} |")
        return "\n".join(lines)

    def messages(self) -> str:
        """Every refusal's and failure's message, one line each."""
        out = []
        for r in self.results:
            if r.message:
                first = " ".join(r.message.split())
                out.append(f"- {r.optimizer} / {r.placement}: {r.outcome}: {first}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table() + ("\n\n" + self.messages() if self.messages() else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "optimizers": list(self.optimizers),
            "placements": list(self.placements),
            "steps": self.steps,
            "atol": self.atol,
            "environment": dict(self.environment),
            "row_steps": dict(self.row_steps),
            "noise": dict(self.noise),
            "results": [asdict(r) for r in self.results],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacementReport:
        return cls(
            tuple(data["optimizers"]), tuple(data["placements"]),
            tuple(PlacementResult(**r) for r in data["results"]), data["steps"], data["atol"],
            dict(data.get("environment", {})), dict(data.get("row_steps", {})), dict(data.get("noise", {})),
        )


def check_placements(
    optimizers: Mapping[str, Any] | Iterable[Any],
    placements: Iterable[str] = PLACEMENTS,
    *,
    steps: int = STEPS,
    timeout: float = 300.0,
) -> PlacementReport:
    """Run every optimizer under every placement on spawned gloo ranks and
    compare each with one process on the full batch.

    ``optimizers`` maps a row name to a config or a :class:`PlacementCase`
    (a list of configs is named by their ``type``). A user's class must be
    importable by the spawned ranks (defined at module level). Returns a
    :class:`PlacementReport`; nothing is raised for a cell that fails, so one
    report shows all of them.
    """
    cases = _cases(optimizers)
    placements = tuple(placements)
    unknown = [p for p in placements if p not in PLACEMENTS]
    if unknown:
        raise ValueError(f"unknown placements {unknown}; the kit has {list(PLACEMENTS)}")
    if steps < 2:
        raise ValueError("steps must be >= 2 (a DCP resume saves after steps // 2)")
    results: dict[tuple[str, str], PlacementResult] = {}
    row_steps: dict[str, int] = {}
    for name, case in cases.items():
        try:
            row_steps[name] = case.steps or max(steps, 3 * _period(case))
        except Exception as exc:  # noqa: BLE001 - the whole row reports it
            _row_crashed(results, name, placements, f"one process: {runs.describe(exc)}")
    live = {n: c for n, c in cases.items() if n in row_steps}
    with tempfile.TemporaryDirectory(prefix="optcore-placements-") as root:
        got = _run_rounds(live, placements, row_steps, root)
        references: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        noise: dict[str, float | None] = {}
        for index, (name, case) in enumerate(live.items()):
            n = row_steps[name]
            try:
                want = _reference(case, ((0, n, 2),), references, name)
                noise[name] = _noise(case, n, want)
            except Exception as exc:  # noqa: BLE001
                _row_crashed(results, name, placements, f"one process: {runs.describe(exc)}")
                continue
            for p in placements:
                if (name, p) in results:
                    continue
                try:
                    want = _reference(case, _segments(p, n), references, name)
                except Exception as exc:  # noqa: BLE001
                    results[name, p] = PlacementResult(name, p, "crashed", message=f"one process: {runs.describe(exc)}")
                    continue
                tol = max(NOISE_FACTOR * noise[name], case.atol or 0.0)
                results[name, p] = _judge(name, p, got.get((name, p), []), want, tol, noise[name])
    environment = {"torch": torch.__version__, "backend": "gloo"}
    try:
        environment["deepspeed"] = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        pass
    return PlacementReport(
        tuple(cases), placements, tuple(results[n, p] for n in cases for p in placements), steps, NOISE_FACTOR,
        environment, {n: row_steps.get(n, steps) for n in cases}, {n: noise.get(n) for n in cases},
    )


def _cases(optimizers: Mapping[str, Any] | Iterable[Any]) -> dict[str, PlacementCase]:
    if isinstance(optimizers, Mapping):
        items = list(optimizers.items())
    else:
        items = [(_name(c.config if isinstance(c, PlacementCase) else c), c) for c in optimizers]
    return {name: c if isinstance(c, PlacementCase) else PlacementCase(c) for name, c in items}


def _name(config: Any) -> str:
    kind = config.get("type", config) if isinstance(config, Mapping) else config
    return kind.__name__ if isinstance(kind, type) else str(kind)


def _row_crashed(results: dict[tuple[str, str], PlacementResult], name: str, placements: tuple[str, ...],
                 message: str) -> None:
    for p in placements:
        results[name, p] = PlacementResult(name, p, "crashed", message=message)


def _period(case: PlacementCase) -> int:
    """The longest period the built optimizer declares (0: none), read from
    its attributes, its defaults and its groups, and those of what it wraps."""
    config, _ = case.reference(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = runs.build(config, runs.model(case.dtype))
    found = [0]
    for each in (opt, getattr(opt, "optimizer", None), *getattr(opt, "parts", {}).values()):
        if each is None:
            continue
        spaces = [vars(each), getattr(each, "defaults", {}) or {}, *getattr(each, "param_groups", [])]
        for space in spaces:
            for key in PERIOD_KEYS:
                value = space.get(key) if isinstance(space, Mapping) else None
                if isinstance(value, int) and not isinstance(value, bool) and 1 < value <= 1000:
                    found.append(value)
    return max(found)


# ----------------------------------------------------------------------------- the ranks
def _run_rounds(
    cases: dict[str, PlacementCase], placements: tuple[str, ...], row_steps: dict[str, int], root: str
) -> dict[tuple[str, str], list[tuple[str, Any]]]:
    """Every stage of every cell, round by round; per cell what each rank of
    its last stage returned (a failed stage ends the cell)."""
    got: dict[tuple[str, str], list[tuple[str, Any]]] = {}
    failed: set[tuple[str, str]] = set()
    names = list(cases)
    rounds = max(len(runs.STAGES[p]) for p in placements) if placements else 0
    for stage in range(rounds):
        by_world: dict[int, list[tuple[str, str, Any, str, int, str]]] = {}
        for p in placements:
            if stage >= len(runs.STAGES[p]):
                continue
            world, _ = runs.STAGES[p][stage]
            for name, case in cases.items():
                if (name, p) in failed:
                    continue
                where = runs.checkpoint_folder(root, p, names.index(name))
                by_world.setdefault(world, []).append((name, p, case.config, case.dtype, row_steps[name], where))
        for world, cells in sorted(by_world.items()):
            if world == 1:
                out = {(c[0], c[1]): [_in_this_process(cases[c[0]], c[1], stage, c[4], c[5])] for c in cells}
            else:
                try:
                    ranks = run_ranks(runs.on_ranks, world, cells, stage, timeout=300.0)
                except AssertionError as exc:  # the group itself failed: every cell of it says so
                    ranks = [{(c[0], c[1]): ("crashed", f"ranks failed: {str(exc)[:2000]}") for c in cells}]
                out = {(c[0], c[1]): [r[c[0], c[1]] for r in ranks] for c in cells}
            for key, values in out.items():
                got[key] = values
                if any(kind != "ran" for kind, _ in values):
                    failed.add(key)
    return got


def _in_this_process(case: PlacementCase, placement: str, stage: int, steps: int, where: str) -> tuple[str, Any]:
    """A resume's one-process side: save after half the steps, or load and train the rest."""
    other = next(w for w, _ in runs.STAGES[placement] if w != 1)
    config, micro = case.reference(other)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if stage == 0:
                module = runs.model(case.dtype)
                opt = runs.build(config, module)
                runs.train(case.dtype, module, opt, range(steps // 2), slice(None), micro)
                runs.dcp_save(module, opt, where)
                return ("ran", [])
            module = runs.model(case.dtype, seed=7)
            opt = runs.build(config, module)
            runs.dcp_load(module, opt, where)
            runs.train(case.dtype, module, opt, range(steps // 2, steps), slice(None), micro)
            return ("ran", runs.full(module))
    except Exception as exc:  # noqa: BLE001
        return runs.failure(exc)


# ----------------------------------------------------------------------------- one process
def _segments(placement: str, steps: int) -> tuple[tuple[int, int, int], ...]:
    """The one process standing for ``placement``: (first step, end, ranks) per part."""
    stages = runs.STAGES[placement]
    if len(stages) == 1:
        return ((0, steps, stages[0][0]),)
    worlds = [w for w, _ in stages]
    if 1 in worlds:  # one side is the one process itself, accumulating for the ranks of the other
        other = next(w for w in worlds if w != 1)
        return ((0, steps, other),)
    half = steps // 2
    return ((0, half, worlds[0]), (half, steps, worlds[1]))


def _reference(
    case: PlacementCase, segments: tuple[tuple[int, int, int], ...],
    cache: dict[tuple[Any, ...], list[torch.Tensor]], name: str,
) -> list[torch.Tensor]:
    """One process on the full batch, each segment standing for its ranks (a
    new optimizer for a segment whose config differs, loading the last one's state)."""
    parts = [(start, end, *case.reference(world)) for start, end, world in segments]
    key = (name, tuple((start, end, micro, repr(config)) for start, end, config, micro in parts))
    if key in cache:
        return cache[key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = runs.model(case.dtype)
        opt, last = None, None
        for start, end, config, micro in parts:
            if opt is None or repr(config) != last:
                state = opt.state_dict() if opt is not None else None
                opt = runs.build(config, module)
                if state is not None:
                    opt.load_state_dict(state)
                last = repr(config)
            runs.train(case.dtype, module, opt, range(start, end), slice(None), micro)
    cache[key] = runs.full(module)
    return cache[key]


def _noise(case: PlacementCase, steps: int, want: list[torch.Tensor]) -> float:
    """How far one process is from itself when it sums the batch in another
    order (two halves, the second first), floored at :data:`EPS_FLOOR` epsilons
    of the largest parameter."""
    config, micro = case.reference(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = runs.model(case.dtype)
        opt = runs.build(config, module)
        runs.train(case.dtype, module, opt, range(steps), slice(None), max(2, micro), reverse=True)
    other = runs.full(module)
    diff = _max_diff(other, want)
    largest = max(float(w.double().abs().max()) for w in want)
    floor = EPS_FLOOR * torch.finfo(getattr(torch, case.dtype)).eps * max(1.0, largest)
    return max(diff, floor) if math.isfinite(diff) else floor


def _max_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    diff = 0.0
    for a, b in zip(got, want, strict=True):
        d = (a.double() - b.double()).abs().max().item()
        diff = math.inf if math.isnan(d) else max(diff, d)
    return diff


def _judge(
    name: str, placement: str, got: list[tuple[str, Any]], want: list[torch.Tensor], tol: float, noise: float | None
) -> PlacementResult:
    if not got:
        return PlacementResult(name, placement, "crashed", message="no rank reported this cell")
    for kind, value in got:
        if kind != "ran":
            return PlacementResult(name, placement, kind, message=value, noise=noise)
    diff = max(_max_diff(params, want) for _, params in got)
    return PlacementResult(name, placement, "equal" if diff <= tol else "differs", diff, atol=tol, noise=noise)
