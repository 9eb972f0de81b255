"""Scheduler look-up, registration, plugins, config forms, errors and warnings."""

from __future__ import annotations

import sys
import textwrap
import warnings

import pytest
import torch

import optcore
from optcore import ConfigError, PluginLoadError, SchedulerNotFoundError
from optcore._plugins import refresh
from optcore.schedulers import SchedulerSpec, unregister_scheduler
from optcore.schedulers import BUILTINS

HF_NAMES = [
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
]
FAIRSEQ_NAMES = ["tri_stage", "triangular", "fixed", "polynomial_decay", "step", "manual", "pass_through"]


def sgd(lr=1e-3, **group):
    return torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(2))], **group}], lr=lr)


# ------------------------------------------------------------------ look-up
@pytest.mark.parametrize("name", HF_NAMES + FAIRSEQ_NAMES)
def test_every_named_schedule_resolves_with_a_schema(name):
    spec = optcore.resolve_scheduler(name)
    assert isinstance(spec, SchedulerSpec)
    assert spec.schema is not None and spec.description
    assert spec.source in ("builtin", "torch")


@pytest.mark.parametrize("cls", BUILTINS, ids=[c.name for c in BUILTINS])
def test_builtins_document_their_formula_and_build_from_their_example(cls):
    doc = cls.__doc__ or ""
    assert any(sym in doc for sym in ("=", "factor", "lr(")), "the docstring gives the formula"
    assert optcore.resolve_scheduler(cls.name).target is cls
    sched = optcore.build_scheduler({"type": cls.name, **cls.example}, sgd(), num_training_steps=1000)
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)


def test_torch_schedulers_resolve_by_name_with_derived_schemas():
    spec = optcore.resolve_scheduler("step_lr")
    assert spec.target is torch.optim.lr_scheduler.StepLR and spec.source == "torch"
    assert set(spec.schema.model_fields) >= {"step_size", "gamma"}
    names = {s.name for s in optcore.list_schedulers()}
    assert {"StepLR", "OneCycleLR", "ReduceLROnPlateau", "CosineAnnealingLR", "cosine", "tri_stage"} <= names
    for spec in optcore.list_schedulers():
        spec.schema.model_json_schema()  # every schema is complete (no dangling forward references)


def test_names_ignore_case_dash_and_underscore():
    assert optcore.resolve_scheduler("Cosine-With-Restarts").name == "cosine_with_restarts"
    assert optcore.resolve_scheduler("reducelronplateau").target is torch.optim.lr_scheduler.ReduceLROnPlateau
    assert optcore.resolve_scheduler("optcore:cosine").name == "cosine"
    assert optcore.resolve_scheduler("torch:StepLR").name == "StepLR"


def test_unknown_name_suggests_close_matches():
    with pytest.raises(SchedulerNotFoundError) as info:
        optcore.resolve_scheduler("cosin_with_restart")
    err = info.value
    assert isinstance(err, KeyError)
    assert "cosine_with_restarts" in err.suggestions
    assert err.searched and "optcore list --schedulers" in str(err)


def test_spec_flags():
    assert optcore.resolve_scheduler("cosine").needs_total
    assert not optcore.resolve_scheduler("constant").needs_total
    assert optcore.resolve_scheduler("CosineAnnealingLR").needs_total
    assert optcore.resolve_scheduler("greedy").needs_metric
    assert not optcore.resolve_scheduler("linear").needs_metric
    assert optcore.resolve_scheduler("polynomial_decay").total_field == "total_num_update"


# ---------------------------------------------------------------- build
def test_config_forms():
    assert type(optcore.build_scheduler("constant", sgd())).__name__ == "ConstantSchedule"
    nested = optcore.build_scheduler(
        {"lr_scheduler": {"type": "linear", "warmup_steps": 2}}, sgd(), num_training_steps=10
    )
    assert nested.warmup_steps == 2 and nested.num_training_steps == 10
    hf = optcore.build_scheduler(
        {"type": "cosine", "num_warmup_steps": 3, "scheduler_specific_kwargs": {"num_cycles": 1.0}}, sgd(), 10
    )
    assert (hf.warmup_steps, hf.num_cycles) == (3, 1.0)
    strings = optcore.build_scheduler({"type": "cosine", "warmup_steps": "5", "num_training_steps": "1e2"}, sgd())
    assert (strings.warmup_steps, strings.num_training_steps) == (5, 100)
    assert optcore.build_scheduler(None, sgd()) is None


def test_config_from_omegaconf_and_pydantic():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"type": "cosine", "warmup_steps": 4, "num_training_steps": 40})
    assert optcore.build_scheduler(cfg, sgd()).warmup_steps == 4
    from pydantic import BaseModel

    class Sched(BaseModel):
        type: str = "inverse_sqrt"
        warmup_steps: int = 7

    assert optcore.build_scheduler(Sched(), sgd()).warmup_steps == 7


def test_num_training_steps_from_config_or_call():
    sched = optcore.build_scheduler({"type": "polynomial_decay", "num_training_steps": 50}, sgd())
    assert sched.total_num_update == 50
    sched = optcore.build_scheduler({"type": "CosineAnnealingLR"}, sgd(), num_training_steps=30)
    assert sched.T_max == 30
    sched = optcore.build_scheduler({"type": "OneCycleLR", "max_lr": 0.1, "epochs": 2, "steps_per_epoch": 5}, sgd(), 99)
    assert sched.total_steps == 10  # epochs x steps_per_epoch wins over the call
    # schedules without a run length ignore it
    optcore.build_scheduler({"type": "constant", "num_training_steps": 10}, sgd())


def test_missing_num_training_steps_is_a_config_error():
    with pytest.raises(ConfigError, match="num_training_steps") as info:
        optcore.build_scheduler({"type": "cosine", "warmup_steps": 10}, sgd())
    [(field, message)] = info.value.problems
    assert field == "num_training_steps" and message.startswith("missing")


def test_bad_fields_are_config_errors_naming_each_field():
    with pytest.raises(ConfigError) as info:
        optcore.build_scheduler({"type": "cosine", "warmup_step": 10, "num_cycles": -1}, sgd(), 100)
    fields = [f for f, _ in info.value.problems]
    assert "warmup_step" in fields and "num_cycles" in fields
    assert "warmup_steps" in str(info.value)  # the close match
    with pytest.raises(ConfigError, match="min_lr"):
        optcore.build_scheduler({"type": "cosine_with_min_lr"}, sgd(), 100)
    with pytest.raises(ConfigError, match="given twice"):
        optcore.build_scheduler({"type": "linear", "warmup_steps": 1, "num_warmup_steps": 2}, sgd(), 100)
    with pytest.raises(ConfigError, match="lr_end"):
        optcore.build_scheduler({"type": "polynomial", "lr_end": 1.0}, sgd(1e-3), 100)
    with pytest.raises(ConfigError, match="max_lr"):
        optcore.build_scheduler({"type": "triangular", "max_lr": 1e-4}, sgd(1e-3))
    with pytest.raises(ConfigError, match="rejected"):
        optcore.build_scheduler({"type": "ReduceLROnPlateau", "factor": 2.0}, sgd())
    with pytest.raises(ConfigError, match="no 'type'"):
        optcore.build_scheduler({"warmup_steps": 3}, sgd())


def test_validate_scheduler_config_builds_nothing():
    from optcore.schedulers import validate_scheduler_config

    spec, kwargs = validate_scheduler_config({"type": "cosine", "num_warmup_steps": 3}, num_training_steps=10)
    assert spec.name == "cosine" and kwargs == {"warmup_steps": 3, "num_training_steps": 10, "num_cycles": 0.5}
    with pytest.raises(ConfigError, match="gama"):
        validate_scheduler_config(
            {"type": "SequentialLR", "schedulers": [{"type": "ExponentialLR", "gama": 0.9}], "milestones": []}
        )


def test_direct_construction_validates_too():
    from optcore.schedulers.cosine import CosineSchedule

    with pytest.raises(ConfigError):
        CosineSchedule(sgd(), num_training_steps=0)


def test_nested_torch_schedulers_build_their_parts():
    opt = sgd(1.0)
    sched = optcore.build_scheduler(
        {
            "type": "SequentialLR",
            "schedulers": [
                {"type": "LinearLR", "start_factor": 0.5, "total_iters": 2},
                {"type": "ExponentialLR", "gamma": 0.5},
            ],
            "milestones": [2],
        },
        opt,
    )
    lrs = []
    for _ in range(4):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.75, 1.0, 0.5, 0.25])


def test_epoch_schedules_follow_step_begin_epoch():
    opt = sgd(1.0)
    sched = optcore.build_scheduler({"type": "fixed", "lr": [1.0, 0.5], "force_anneal": 3, "lr_shrink": 0.1}, opt)
    assert sched.step_begin_epoch(2) == [0.5]
    sched.step_begin_epoch()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_pass_through_leaves_the_lr_alone_and_delegates():
    opt = sgd(0.1)
    calls = []

    class Inner:
        def step(self):
            calls.append("step")

        def state_dict(self):
            return {"inner": 1}

        def load_state_dict(self, sd):
            calls.append(sd)

    opt.lr_scheduler = Inner()
    sched = optcore.build_scheduler("pass_through", opt)
    opt.param_groups[0]["lr"] = 0.05  # the optimizer's own doing
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.05 and sched.get_last_lr() == [0.05] and calls == ["step"]
    sched.load_state_dict(sched.state_dict())
    assert calls[-1] == {"inner": 1}
    # lr None (Adafactor relative-step mode) is fine
    none_lr = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    none_lr.param_groups[0]["lr"] = None
    optcore.build_scheduler("pass_through", none_lr).step()


# ---------------------------------------------------------------- warnings
def test_warmup_longer_than_the_run_warns():
    with pytest.warns(UserWarning, match="longer than the run"):
        optcore.build_scheduler({"type": "linear", "warmup_steps": 200}, sgd(), num_training_steps=100)


def _declaring(value):
    """An SGD whose class declares the contract's ``lr_schedule``."""
    cls = type("Declared", (torch.optim.SGD,), {"lr_schedule": value})
    return cls([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)


def test_an_optimizer_that_ignores_its_lr_takes_pass_through_only():
    opt = _declaring("none")
    for config in ({"type": "polynomial_decay"}, "constant"):
        with pytest.raises(ConfigError, match="pass_through"):
            optcore.build_scheduler(config, opt, num_training_steps=10)
    optcore.build_scheduler("pass_through", opt).step()


def test_adafactor_declares_that_relative_step_mode_ignores_the_lr():
    spec = next((s for s in optcore.list_optimizers(all=True) if s.qualified == "optcore-adafactor:Adafactor"), None)
    if spec is None:
        pytest.skip("optcore-adafactor is not installed")
    config = {"type": spec.qualified, "lr": 1e-3, "relative_step": False, "scale_parameter": False}
    opt = optcore.build_optimizer(config, [torch.nn.Parameter(torch.zeros(2, 2))])
    assert opt.lr_schedule == "any"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optcore.build_scheduler({"type": "cosine"}, opt, num_training_steps=10)
    opt.param_groups[0]["relative_step"] = True  # the group computes its own step size from here on
    assert opt.lr_schedule == "none"
    with pytest.raises(ConfigError, match="pass_through"):
        optcore.build_scheduler({"type": "cosine"}, opt, num_training_steps=10)


def test_the_schedulers_read_the_capability_not_names_or_keys():
    """A ``relative_step`` key, or a class named like a schedule-free one that
    declares nothing and that optcore does not know, is an ordinary optimizer."""
    opt = sgd(1e-3)
    opt.param_groups[0]["relative_step"] = True
    named = type("AdamWScheduleFree", (torch.optim.SGD,), {})([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    for optimizer in (opt, named):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            optcore.build_scheduler({"type": "cosine"}, optimizer, num_training_steps=10)


def test_an_undeclared_lr_schedule_value_is_refused_by_name():
    with pytest.raises(optcore.OptcoreError, match="Declared.lr_schedule is 'constnat'; it must be one of any, constant"):
        optcore.build_scheduler({"type": "cosine"}, _declaring("constnat"), num_training_steps=10)


def test_optimizer_without_lr_needs_pass_through():
    transformers = pytest.importorskip("transformers")
    opt = transformers.Adafactor([torch.nn.Parameter(torch.zeros(2))], lr=None, relative_step=True)
    with pytest.raises(ConfigError, match="pass_through"):
        optcore.build_scheduler({"type": "cosine"}, opt, num_training_steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optcore.build_scheduler("pass_through", opt).step()


def _schedule_free_optimizers():
    """A class declaring ``lr_schedule = "constant"``, and pytorch_optimizer's
    schedule-free class (known to optcore) built by hand, built by optcore and
    inside optcore-fp16's wrapper."""
    yield "declared", _declaring("constant")
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    params = [torch.nn.Parameter(torch.zeros(2))]
    yield "by hand", pytorch_optimizer.ScheduleFreeAdamW(params, lr=1e-3)
    built = optcore.build_optimizer({"type": "pytorch_optimizer:ScheduleFreeAdamW", "lr": 1e-3}, params)
    assert built.lr_schedule == "constant"
    yield "built", built
    if any(s.name == "FP16Optimizer" for s in optcore.list_optimizers()):
        yield "wrapped", optcore.build_optimizer(
            {"type": "pytorch_optimizer:ScheduleFreeAdamW", "lr": 1e-3, "precision": "bf16"},
            [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))])


def test_schedule_free_optimizers_warn_for_decaying_schedules():
    for label, opt in _schedule_free_optimizers():
        with pytest.warns(UserWarning, match="schedule-free"):
            optcore.build_scheduler({"type": "cosine"}, opt, num_training_steps=10)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            optcore.build_scheduler({"type": "constant_with_warmup", "warmup_steps": 5}, opt)


# ---------------------------------------------------------------- registering
class Halving(torch.optim.lr_scheduler.LRScheduler):
    """Halve the lr every ``every`` steps: lr(t) = lr0 / 2 ** (t // every)."""

    def __init__(self, optimizer, every: int = 2, last_epoch: int = -1):
        self.every = every
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base / 2 ** (self.last_epoch // self.every) for base in self.base_lrs]


def test_register_scheduler_forms():
    try:
        optcore.register_scheduler("halving", Halving)
        spec = optcore.resolve_scheduler("Halving")
        assert spec.source == "user" and "every" in spec.schema.model_fields
        sched = optcore.build_scheduler({"type": "halving", "every": 1}, sgd(1.0))
        sched.optimizer.step()
        sched.step()
        assert sched.get_last_lr() == [0.5]
        with pytest.raises(ConfigError):
            optcore.build_scheduler({"type": "halving", "every": "often"}, sgd())
        with pytest.raises(ConfigError, match="already registered"):
            optcore.register_scheduler("halving", Halving.__mro__[1])
    finally:
        unregister_scheduler("halving")

    @optcore.register_scheduler("warmup_then_hold")
    def make(optimizer, warmup_steps: int = 0):
        return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=max(1, warmup_steps))

    try:
        sched = optcore.build_scheduler({"type": "warmup_then_hold", "num_warmup_steps": 4}, sgd())
        assert sched.total_iters == 4
    finally:
        unregister_scheduler("warmup_then_hold")


def test_registering_a_builtin_name_is_shadowed_with_a_warning():
    with pytest.warns(UserWarning, match="resolves first"):
        optcore.register_scheduler("cosine", Halving)
    try:
        spec = optcore.resolve_scheduler("cosine")
        assert spec.source == "builtin" and [s.source for s in spec.shadowed] == ["user"]
        assert optcore.resolve_scheduler("user:cosine").target is Halving
    finally:
        unregister_scheduler("cosine")


# ---------------------------------------------------------------- plugins
@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A fake installed distribution with one good and one broken scheduler."""
    (tmp_path / "fake_sched_plugin.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Tenfold(torch.optim.lr_scheduler.LambdaLR):
                \"\"\"lr(t) = lr0 / 10 after the first step.\"\"\"
                needs_total = False

                def __init__(self, optimizer, drop: float = 0.1):
                    self.drop = drop
                    super().__init__(optimizer, lambda t: 1.0 if t == 0 else drop)
            """
        )
    )
    (tmp_path / "broken_sched_plugin.py").write_text("raise ImportError('missing dependency foo')\n")
    info = tmp_path / "fake_sched_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-sched-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[optcore.schedulers]\ntenfold = fake_sched_plugin:Tenfold\nbroken = broken_sched_plugin:Broken\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("OPTCORE_PLUGINS", raising=False)
    refresh()
    yield
    sys.modules.pop("fake_sched_plugin", None)
    sys.modules.pop("broken_sched_plugin", None)
    monkeypatch.undo()
    refresh()


def test_entry_point_plugins_load_lazily(plugin_dist):
    optcore.resolve_scheduler("cosine")
    assert "fake_sched_plugin" not in sys.modules
    spec = optcore.resolve_scheduler("tenfold")
    assert spec.source == "plugin" and spec.provider == "fake-sched-plugin"
    assert "fake_sched_plugin" not in sys.modules  # still only metadata
    sched = optcore.build_scheduler({"type": "tenfold", "drop": 0.5}, sgd(1.0))
    assert "fake_sched_plugin" in sys.modules
    sched.optimizer.step()
    sched.step()
    assert sched.get_last_lr() == [0.5]


def test_a_broken_plugin_fails_only_for_its_own_name(plugin_dist):
    with pytest.raises(PluginLoadError, match="fake-sched-plugin") as info:
        optcore.build_scheduler("broken", sgd())
    assert "missing dependency foo" in str(info.value)
    assert optcore.build_scheduler({"type": "tenfold"}, sgd()) is not None
    assert optcore.build_scheduler("constant", sgd()) is not None


def test_plugin_environment_switches(plugin_dist, monkeypatch):
    monkeypatch.setenv("OPTCORE_PLUGINS", "tenfold")
    optcore.resolve_scheduler("tenfold")
    with pytest.raises(SchedulerNotFoundError):
        optcore.resolve_scheduler("broken")
    monkeypatch.setenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(SchedulerNotFoundError):
        optcore.resolve_scheduler("tenfold")


# ---------------------------------------------------------------- docs
def test_docs_reference_is_generated_from_the_registry():
    """docs/schedulers.md's reference section matches the code (regenerate
    with ``python docs/gen_schedule_plots.py``)."""
    pytest.importorskip("matplotlib")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "gen_schedule_plots.py"
    spec = importlib.util.spec_from_file_location("gen_schedule_plots", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render_page() == module.PAGE.read_text(), "run: python docs/gen_schedule_plots.py"
    names = {name for name, _ in module.schedules()}
    assert {p.stem for p in module.IMG.glob("*.png")} == names


@pytest.mark.parametrize(
    "config",
    [
        {"type": "cosine"},
        {"type": "cosine_with_restarts", "num_cycles": 2},
        {"type": "cosine_with_min_lr", "min_lr_rate": 0.1},
        {"type": "cosine_warmup_with_min_lr", "min_lr_rate": 0.1},
        {"type": "warmup_stable_decay", "num_decay_steps": 4, "warmup_type": "cosine", "decay_type": "cosine"},
    ],
    ids=lambda c: c["type"],
)
def test_cosine_schedules_share_one_cosine_formula(config, monkeypatch):
    """Every cosine-shaped schedule decays along cosine.cosine_wave (parity with
    transformers is tested in test_schedulers_reference)."""
    from optcore.schedulers import cosine, staged

    calls = []
    real = cosine.cosine_wave
    for module in (cosine, staged):
        monkeypatch.setattr(module, "cosine_wave", lambda *a, **k: calls.append(a) or real(*a, **k))
    optimizer = sgd()
    scheduler = optcore.build_scheduler({**config, "warmup_steps": 2}, optimizer, num_training_steps=10)
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    assert len(calls) >= 6  # every step of the decay (WSD: of its cosine warm-up and decay)


def test_cosine_wave_spans_one_to_the_floor():
    from optcore.schedulers.cosine import cosine_wave

    assert cosine_wave(0.0, 0.5) == 1.0 and cosine_wave(1.0, 0.5) == 0.0
    assert cosine_wave(1.0, 0.5, floor=0.2) == pytest.approx(0.2) and cosine_wave(0.5, 1.0) == 0.0
    assert cosine_wave(0.5, 0.5, floor=0.2) == pytest.approx(0.6)


def test_listing_schedulers_imports_no_plugin_and_survives_a_broken_one(plugin_dist, capsys):
    """`optcore list --schedulers` describes every name from metadata: a plugin's
    flags and description wait for `optcore show NAME`, which loads it."""
    from optcore.cli import describe, main

    rows = {s.qualified: s.describe() for s in optcore.list_schedulers()}
    assert "fake_sched_plugin" not in sys.modules and "broken_sched_plugin" not in sys.modules
    tenfold = rows["fake-sched-plugin:tenfold"]
    assert tenfold["needs_total"] is None and tenfold["description"] is None  # not known without importing it
    assert rows["optcore:cosine"]["needs_total"] is True and rows["optcore:cosine"]["description"]
    assert main(["list", "--schedulers", "--json"]) == 0
    assert "fake-sched-plugin:broken" in capsys.readouterr().out
    shown = describe("tenfold", scheduler=True)
    assert shown["needs_total"] is False and shown["needs_metric"] is False
    assert shown["description"].startswith("lr(t) = lr0 / 10")
