"""The built-in schedules against their references, over the whole schedule.

- transformers' names: the installed ``transformers.get_scheduler`` (and its
  ``GreedyLR``), to 1e-9 at a base lr of 1;
- fairseq's names: fairseq is not installable here, so each has a small
  transcription of fairseq's ``step_update`` / ``step_begin_epoch``
  (``fairseq/optim/lr_scheduler/*.py``) below, driven the way fairseq's
  trainer drives it (``step_update(0)`` after building, ``step_begin_epoch(e)``
  then ``step_update(n)`` at each epoch start, ``step_update(n)`` after update
  ``n``).

Also here, for every built-in: resume from a state_dict mid-schedule, and
layer-wise ``lr_scale`` ratios.
"""

from __future__ import annotations

import io
import math
import random

import pytest
import torch

import optcore
from optcore.schedulers import BUILTINS

transformers_optimization = pytest.importorskip("transformers.optimization")


def make_optimizer(lrs=(1.0,), scales=None):
    groups = []
    for i, lr in enumerate(lrs):
        group = {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr}
        if scales is not None:
            group["lr_scale"] = scales[i]
        groups.append(group)
    return torch.optim.SGD(groups, lr=lrs[0] / (scales[0] if scales else 1.0))


def run_steps(scheduler, optimizer, n, metrics=None, epoch_every=None, start=0):
    """lrs of every group now and after each of ``n`` more steps (``start``
    steps were taken before; epochs end every ``epoch_every`` steps)."""
    out = [[float(g["lr"]) for g in optimizer.param_groups]]
    for i in range(n):
        optimizer.step()
        if metrics is not None:
            scheduler.step(metrics[i])
        else:
            scheduler.step()
        if epoch_every and (start + i + 1) % epoch_every == 0:
            scheduler.step_begin_epoch()
        out.append([float(g["lr"]) for g in optimizer.param_groups])
    return out


def assert_close(ours, ref, tol=1e-9):
    assert len(ours) == len(ref)
    for t, (a, b) in enumerate(zip(ours, ref, strict=True)):
        for x, y in zip(a, b, strict=True):
            assert math.isclose(x, y, rel_tol=tol, abs_tol=tol), f"step {t}: {a} != {b}"


# --------------------------------------------------------------- transformers
W, T = 10, 100
HF_CASES = [
    ("linear", {}),
    ("linear", {"_warmup": 0}),
    ("cosine", {}),
    ("cosine", {"num_cycles": 1.5}),
    ("cosine_with_restarts", {"num_cycles": 3}),
    ("polynomial", {"lr_end": 1e-3, "power": 2.0}),
    ("polynomial", {"lr_end": 0.0, "power": 0.5}),
    ("constant", {"_warmup": None}),
    ("constant_with_warmup", {}),
    ("inverse_sqrt", {}),
    ("inverse_sqrt", {"timescale": 25}),
    ("inverse_sqrt", {"_warmup": 0}),
    ("cosine_with_min_lr", {"min_lr": 1e-2}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.05, "num_cycles": 0.75}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr": 1e-2, "warmup_lr_rate": 0.2}),
    *[
        ("warmup_stable_decay", {"num_decay_steps": 20, "warmup_type": w, "decay_type": d, "min_lr_ratio": 0.1})
        for w in ("linear", "cosine", "1-sqrt")
        for d in ("linear", "cosine", "1-sqrt")
    ],
    ("warmup_stable_decay", {"num_decay_steps": 30, "num_stable_steps": 40, "_total": None}),
]


@pytest.mark.parametrize("name,kwargs", HF_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(HF_CASES)])
def test_transformers_schedules_match_get_scheduler(name, kwargs):
    kwargs = dict(kwargs)
    warmup = kwargs.pop("_warmup", W)
    total = kwargs.pop("_total", T)
    steps = T + 20  # past the end too

    ref_opt = make_optimizer((1.0, 0.3))
    ref = transformers_optimization.get_scheduler(
        name, ref_opt, num_warmup_steps=warmup, num_training_steps=total, scheduler_specific_kwargs=dict(kwargs)
    )
    expected = run_steps(ref, ref_opt, steps)

    config = {"type": name, **kwargs}
    if warmup is not None:
        config["num_warmup_steps"] = warmup  # transformers' spelling is accepted
    opt = make_optimizer((1.0, 0.3))
    ours = optcore.build_scheduler(config, opt, num_training_steps=total)
    assert_close(run_steps(ours, opt, steps), expected)


def _metrics(n, seed=0, mode="min"):
    """A noisy loss that improves, stalls, then improves again."""
    rng = random.Random(seed)
    out, value = [], 1.0
    for i in range(n):
        drift = -0.02 if (i // 40) % 2 == 0 else 0.0
        value = value + drift + rng.uniform(-0.01, 0.01)
        out.append(value if mode == "min" else -value)
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {"patience": 3, "factor": 0.8, "min_lr": 1e-3, "max_lr": 0.5},
        {"patience": 2, "factor": 0.9, "smooth": True, "window_size": 5, "cooldown": 2, "warmup": 3},
        {"patience": 1, "factor": 0.5, "min_lr": 0.01, "reset_start": 3, "threshold_mode": "rel", "threshold": 0.01},
        {"mode": "max", "patience": 2, "max_lr": 0.2},
    ],
)
def test_greedy_matches_transformers(kwargs):
    metrics = _metrics(200, mode=kwargs.get("mode", "min"))
    ref_opt = make_optimizer((0.1, 0.05))
    ref = transformers_optimization.GreedyLR(ref_opt, **kwargs)
    expected = run_steps(ref, ref_opt, len(metrics), metrics)
    opt = make_optimizer((0.1, 0.05))
    ours = optcore.build_scheduler({"type": "greedy", **kwargs}, opt)
    assert_close(run_steps(ours, opt, len(metrics), metrics), expected)
    assert len({tuple(r) for r in expected}) > 3  # the lr did move


def test_reduce_lr_on_plateau_is_transformers_one():
    metrics = _metrics(120, seed=1)
    ref_opt = make_optimizer()
    ref = transformers_optimization.get_scheduler(
        "reduce_lr_on_plateau", ref_opt, scheduler_specific_kwargs={"patience": 2, "factor": 0.5}
    )
    opt = make_optimizer()
    ours = optcore.build_scheduler({"type": "reduce_lr_on_plateau", "patience": 2, "factor": 0.5}, opt)
    assert isinstance(ours, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert_close(run_steps(ours, opt, len(metrics), metrics), run_steps(ref, ref_opt, len(metrics), metrics))


# -------------------------------------------------------------------- fairseq
# Reference transcriptions of fairseq's schedulers (fairseq/optim/lr_scheduler/
# *.py), in absolute learning rates; ``lr`` is fairseq's ``cfg.lr`` list.
class FairseqRef:
    """fairseq's scheduler protocol on a one-number optimizer."""

    def __init__(self, lr):
        self.cfg_lr = list(lr)
        self.opt_lr = self.cfg_lr[0]

    def step_begin_epoch(self, epoch):  # default: no change
        pass


class RefTriStage(FairseqRef):  # tri_stage_lr_scheduler.py
    def __init__(
        self,
        lr,
        warmup_steps=0,
        hold_steps=0,
        decay_steps=0,
        phase_ratio=None,
        init_lr_scale=0.01,
        final_lr_scale=0.01,
        max_update=None,
    ):
        super().__init__(lr)
        self.peak_lr = lr[0]
        self.init_lr = init_lr_scale * lr[0]
        self.final_lr = final_lr_scale * lr[0]
        if phase_ratio is not None:
            self.warmup_steps = int(max_update * phase_ratio[0])
            self.hold_steps = int(max_update * phase_ratio[1])
            self.decay_steps = int(max_update * phase_ratio[2])
        else:
            self.warmup_steps, self.hold_steps, self.decay_steps = warmup_steps, hold_steps, decay_steps
        self.warmup_rate = (self.peak_lr - self.init_lr) / self.warmup_steps if self.warmup_steps != 0 else 0
        self.decay_factor = -math.log(final_lr_scale) / self.decay_steps
        self.opt_lr = self.init_lr

    def step_update(self, num_updates):
        if num_updates < self.warmup_steps:
            self.opt_lr = self.init_lr + self.warmup_rate * num_updates
        elif num_updates < self.warmup_steps + self.hold_steps:
            self.opt_lr = self.peak_lr
        elif num_updates <= self.warmup_steps + self.hold_steps + self.decay_steps:
            self.opt_lr = self.peak_lr * math.exp(
                -self.decay_factor * (num_updates - self.warmup_steps - self.hold_steps)
            )
        else:
            self.opt_lr = self.final_lr


class RefTriangular(FairseqRef):  # triangular_lr_scheduler.py
    def __init__(self, lr, max_lr, lr_period_updates=5000, lr_shrink=0.1, shrink_min=False):
        super().__init__(lr)
        self.min_lr, self.max_lr = lr[0], max_lr
        self.stepsize = lr_period_updates // 2
        self.lr_shrink, self.shrink_min = lr_shrink, shrink_min

    def step_update(self, num_updates):
        cycle = math.floor(num_updates / (2 * self.stepsize))
        lr_shrink = self.lr_shrink**cycle
        max_lr = self.max_lr * lr_shrink
        min_lr = self.min_lr * lr_shrink if self.shrink_min else self.min_lr
        x = abs(num_updates / self.stepsize - 2 * (cycle + 1) + 1)
        self.opt_lr = min_lr + (max_lr - min_lr) * max(0, (1 - x))


class RefFixed(FairseqRef):  # fixed_schedule.py
    def __init__(self, lr, force_anneal=None, lr_shrink=0.1, warmup_updates=0):
        super().__init__(lr)
        self.force_anneal, self.lr_shrink, self.warmup_updates = force_anneal, lr_shrink, warmup_updates
        self.lr = lr[0]
        self.warmup_factor = 1.0 / warmup_updates if warmup_updates > 0 else 1

    def step_begin_epoch(self, epoch):
        lrs = self.cfg_lr
        if self.force_anneal is None or epoch < self.force_anneal:
            self.lr = lrs[min(epoch - 1, len(lrs) - 1)]
        else:
            self.lr = lrs[-1] * self.lr_shrink ** (epoch + 1 - self.force_anneal)
        self.opt_lr = self.warmup_factor * self.lr

    def step_update(self, num_updates):
        if self.warmup_updates > 0 and num_updates < self.warmup_updates:
            self.warmup_factor = (num_updates + 1) / float(self.warmup_updates)
            self.opt_lr = self.warmup_factor * self.lr
        else:
            self.opt_lr = self.lr


class RefPolynomialDecay(FairseqRef):  # polynomial_decay_schedule.py
    def __init__(
        self, lr, total_num_update, warmup_updates=0, end_learning_rate=0.0, zero_lr_warmup_steps=0, power=1.0
    ):
        super().__init__(lr)
        self.lr = lr[0]
        self.total, self.warmup, self.end = total_num_update, warmup_updates, end_learning_rate
        self.zero, self.power = zero_lr_warmup_steps, power

    def step_update(self, num_updates):
        if self.zero > 0 and num_updates <= self.zero:
            lr = 0
        elif self.warmup > 0 and num_updates <= self.warmup + self.zero:
            lr = (num_updates - self.zero) / float(self.warmup) * self.lr
        elif num_updates >= self.total:
            lr = self.end
        else:
            warmup = self.warmup + self.zero
            pct_remaining = 1 - (num_updates - warmup) / (self.total - warmup)
            lr = (self.lr - self.end) * pct_remaining**self.power + self.end
        self.opt_lr = lr


class RefStep(FairseqRef):  # step_lr_scheduler.py
    def __init__(self, lr, warmup_updates=0, warmup_init_lr=-1, min_lr=0.0, lr_decay_period=25000, lr_decay=0.5):
        super().__init__(lr)
        self.max_lr, self.min_lr = lr[0], min_lr
        self.period, self.decay, self.warmup_updates = lr_decay_period, lr_decay, warmup_updates
        self.warmup_init_lr = warmup_init_lr if warmup_init_lr >= 0 else min_lr
        self.warmup_lr_step = (self.max_lr - self.warmup_init_lr) / warmup_updates if warmup_updates > 0 else 1
        self.opt_lr = self.warmup_init_lr

    def step_update(self, num_updates):
        if num_updates < self.warmup_updates:
            self.opt_lr = self.warmup_init_lr + num_updates * self.warmup_lr_step
        else:
            mult = self.decay ** ((num_updates - self.warmup_updates) // self.period)
            self.opt_lr = max(self.max_lr * mult, self.min_lr)


class RefManual(FairseqRef):  # manual_lr_scheduler.py
    def __init__(self, lr, epoch2lr, update2lr):
        super().__init__(lr)
        self.epoch2lr, self.update2lr = self.parse(epoch2lr), self.parse(update2lr)

    @staticmethod
    def parse(table):
        out = {}
        for key, val in table.items():
            key = str(key)
            if "," in key:
                for k in key.split(","):
                    out[int(k)] = float(val)
            elif "-" in key:
                s, e = key.split("-")
                for k in range(int(s), int(e) + 1):
                    out[k] = float(val)
            else:
                out[int(key)] = float(val)
        return out

    def step_begin_epoch(self, epoch):
        keys = [k for k in self.epoch2lr if k <= epoch]
        self.opt_lr = self.epoch2lr[max(keys)] if keys else self.opt_lr

    def step_update(self, num_updates):
        keys = [k for k in self.update2lr if k <= num_updates]
        self.opt_lr = self.update2lr[max(keys)] if keys else self.opt_lr


def fairseq_trajectory(ref, n_updates, epoch_every):
    """lr after building and after each update, as fairseq's trainer leaves it."""
    ref.step_update(0)  # Trainer._build_optimizer
    ref.step_begin_epoch(1)  # Trainer.begin_epoch -> lr_step_begin_epoch
    ref.step_update(0)
    out = [ref.opt_lr]
    epoch = 1
    for n in range(1, n_updates + 1):
        ref.step_update(n)
        if n % epoch_every == 0:
            epoch += 1
            ref.step_begin_epoch(epoch)
            ref.step_update(n)
        out.append(ref.opt_lr)
    return out


LR0 = 0.5
FAIRSEQ_CASES = [
    ("tri_stage", RefTriStage, {"warmup_steps": 20, "hold_steps": 30, "decay_steps": 40}),
    (
        "tri_stage",
        RefTriStage,
        {"phase_ratio": (0.1, 0.4, 0.5), "max_update": 100, "init_lr_scale": 0.05, "final_lr_scale": 0.02},
    ),
    ("triangular", RefTriangular, {"max_lr": 2.0, "lr_period_updates": 30}),
    ("triangular", RefTriangular, {"max_lr": 1.5, "lr_period_updates": 25, "lr_shrink": 0.5, "shrink_min": True}),
    ("fixed", RefFixed, {"warmup_updates": 15, "force_anneal": 3, "lr_shrink": 0.5}),
    ("fixed", RefFixed, {"lr": [0.5, 0.3, 0.2]}),
    ("fixed", RefFixed, {"lr": [0.5, 0.25], "force_anneal": 4, "warmup_updates": 5}),
    (
        "polynomial_decay",
        RefPolynomialDecay,
        {"total_num_update": 100, "warmup_updates": 10, "end_learning_rate": 0.01},
    ),
    (
        "polynomial_decay",
        RefPolynomialDecay,
        {"total_num_update": 100, "warmup_updates": 10, "zero_lr_warmup_steps": 5, "power": 2.0},
    ),
    ("step", RefStep, {"warmup_updates": 10, "lr_decay_period": 15, "lr_decay": 0.7, "min_lr": 0.05}),
    ("step", RefStep, {"warmup_updates": 10, "warmup_init_lr": 0.1, "lr_decay_period": 7}),
    ("step", RefStep, {"lr_decay_period": 20}),
    ("manual", RefManual, {"epoch2lr": {"1": 0.5, "2,3": 0.3, "4-5": 0.1}, "update2lr": {"70": 0.05, "95": 0.02}}),
    ("manual", RefManual, {"epoch2lr": {2: 0.2}, "update2lr": {}}),
    ("manual", RefManual, {"epoch2lr": {}, "update2lr": {"0": 0.4, "10-12": 0.3, "50": 0.1}}),
]


@pytest.mark.parametrize("name,ref_cls,kwargs", FAIRSEQ_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(FAIRSEQ_CASES)])
def test_fairseq_schedules_match_reference(name, ref_cls, kwargs):
    n, epoch_every = 120, 20
    lrs = kwargs.get("lr", [LR0])
    ref_kwargs = {k: v for k, v in kwargs.items() if k != "lr"}
    expected = fairseq_trajectory(ref_cls(lrs, **ref_kwargs), n, epoch_every)

    opt = make_optimizer((LR0,))
    config = {"type": name, **kwargs}
    if name == "manual":
        config["epoch2lr"] = repr(kwargs["epoch2lr"])  # fairseq passes a string literal
    ours = optcore.build_scheduler(config, opt)
    got = run_steps(ours, opt, n, epoch_every=epoch_every if hasattr(ours, "step_begin_epoch") else None)
    assert_close(got, [[x] for x in expected])


def test_fairseq_warmup_updates_accepts_warmup_steps():
    a = optcore.build_scheduler({"type": "step", "warmup_steps": 10, "lr_decay_period": 5}, make_optimizer())
    b = optcore.build_scheduler({"type": "step", "warmup_updates": 10, "lr_decay_period": 5}, make_optimizer())
    assert a.warmup_updates == b.warmup_updates == 10


# ------------------------------------------------------------ every built-in
def _example(cls):
    return {"type": cls.name, **cls.example}


def _drive(cls, scheduler, optimizer, n, start=0):
    metrics = _metrics(start + n)[start:] if cls.needs_metric else None
    every = 50 if hasattr(scheduler, "step_begin_epoch") else None
    return run_steps(scheduler, optimizer, n, metrics, epoch_every=every, start=start)


@pytest.mark.parametrize("cls", BUILTINS, ids=[c.name for c in BUILTINS])
def test_resume_from_state_dict_gives_the_same_lrs(cls):
    total, cut = 300, 137
    lrs = (1e-3, 4e-4)
    opt = make_optimizer(lrs)
    sched = optcore.build_scheduler(_example(cls), opt, num_training_steps=total)
    full = _drive(cls, sched, opt, total)

    opt = make_optimizer(lrs)
    sched = optcore.build_scheduler(_example(cls), opt, num_training_steps=total)
    first = _drive(cls, sched, opt, cut)
    buffer = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)

    opt2 = make_optimizer(lrs)
    sched2 = optcore.build_scheduler(_example(cls), opt2, num_training_steps=total)
    opt2.load_state_dict(saved["optimizer"])
    sched2.load_state_dict(saved["scheduler"])
    rest = _drive(cls, sched2, opt2, total - cut, start=cut)
    assert first + rest[1:] == full


@pytest.mark.parametrize("cls", BUILTINS, ids=[c.name for c in BUILTINS])
def test_lr_scale_ratio_holds(cls):
    opt = make_optimizer((1e-3, 2.5e-4, 1e-4), scales=(1.0, 0.25, 0.1))
    sched = optcore.build_scheduler(_example(cls), opt, num_training_steps=300)
    for lrs in _drive(cls, sched, opt, 300):
        if lrs[0] > 0:
            assert math.isclose(lrs[1] / lrs[0], 0.25, rel_tol=1e-9)
            assert math.isclose(lrs[2] / lrs[0], 0.1, rel_tol=1e-9)
        else:
            assert lrs == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "config",
    [
        {"type": "ReduceLROnPlateau", "patience": 1, "min_lr": 4e-4},
        {"type": "OneCycleLR", "max_lr": 1e-2},
        {"type": "CyclicLR", "base_lr": 1e-4, "max_lr": 1e-2, "step_size_up": 20},
        {"type": "StepLR", "step_size": 30},
    ],
)
def test_lr_scale_ratio_holds_for_torch_schedulers(config):
    opt = make_optimizer((1e-3, 2.5e-4), scales=(1.0, 0.25))
    sched = optcore.build_scheduler(config, opt, num_training_steps=200)
    metrics = _metrics(200) if config["type"] == "ReduceLROnPlateau" else None
    for lrs in run_steps(sched, opt, 199, metrics):
        assert math.isclose(lrs[1] / lrs[0], 0.25, rel_tol=1e-9)


def test_lr_scale_through_optcore_build():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    config = {
        "optimizer": {
            "type": "AdamW",
            "lr": 1e-3,
            "weight_decay": 0.0,
            "param_groups": [{"params": r"^1\.", "lr_scale": 0.1}],
        },
        "lr_scheduler": {"type": "cosine", "warmup_steps": 5},
    }
    optimizer, scheduler = optcore.build(config, model, num_training_steps=50)
    assert len(optimizer.param_groups) == 2
    for _ in range(50):
        optimizer.step()
        scheduler.step()
        a, b = (g["lr"] for g in optimizer.param_groups)
        if a > 0:
            assert math.isclose(b / a, 0.1, rel_tol=1e-9)


def test_metric_driven_schedulers_step_with_a_metric():
    for name in ("greedy", "reduce_lr_on_plateau"):
        spec = optcore.resolve_scheduler(name)
        assert spec.needs_metric
        opt = make_optimizer((0.1,))
        sched = optcore.build_scheduler({"type": name, "patience": 0, "factor": 0.5}, opt)
        for loss in (1.0, 2.0, 3.0):
            opt.step()
            sched.step(torch.tensor(loss))  # a tensor metric is fine too
        assert opt.param_groups[0]["lr"] < 0.1
