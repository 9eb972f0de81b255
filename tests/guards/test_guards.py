"""Untrusted input (optcore.guards): crafted checkpoints and misused tensors end
in an OptcoreError with the process alive, regexes match in linear time, and
configs given as Python data are held to the limits of config files."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import optcore
from optcore.guards import MAX_PATTERN_LENGTH

sys.path.insert(0, str(Path(__file__).parent))
import untrusted_cases  # noqa: E402

CASES_SCRIPT = Path(untrusted_cases.__file__)


def _run_cases(kind: str) -> dict[str, str]:
    """Every case of ``kind`` in one subprocess: a heap corruption ends that
    process, and the cases it did not reach fail with its exit code."""
    proc = subprocess.run(
        [sys.executable, str(CASES_SCRIPT), kind], capture_output=True, text=True, timeout=600, cwd=CASES_SCRIPT.parent
    )
    outcomes = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            name, _, outcome = line[5:].partition(": ")
            outcomes[name] = outcome
    outcomes["<exit>"] = f"exit code {proc.returncode}; stderr: {proc.stderr[-600:]}"
    return outcomes


@pytest.fixture(scope="module")
def checkpoint_outcomes() -> dict[str, str]:
    return _run_cases("checkpoint")


@pytest.fixture(scope="module")
def step_outcomes() -> dict[str, str]:
    return _run_cases("step")


@pytest.mark.parametrize("case", list(untrusted_cases.CHECKPOINT_CASES))
def test_a_crafted_checkpoint_is_refused_and_nothing_loads(case, checkpoint_outcomes):
    """Relabelled shapes, broadcastable moments, FP16Optimizer's inner moments,
    tampered step counts and structures: a ConfigError before anything loads,
    and the optimizer still steps (on main: heap corruption, a TypeError or
    KeyError, or a silent load)."""
    outcome = checkpoint_outcomes.get(case, f"never reported: {checkpoint_outcomes['<exit>']}")
    assert outcome.startswith("refused ConfigError"), outcome


@pytest.mark.parametrize("case", list(untrusted_cases.STEP_CASES))
def test_a_tensor_the_fused_kernel_cannot_use_is_refused_before_it_runs(case, step_outcomes):
    """A replaced ``.data``, a freed storage, a state tensor of another size or
    dtype: torch's fused kernels wrote through them."""
    outcome = step_outcomes.get(case, f"never reported: {step_outcomes['<exit>']}")
    assert outcome.startswith("refused StepError"), outcome


def _stepped(config, model):
    opt = optcore.build_optimizer(config, model)
    model(torch.randn(2, model.in_features)).pow(2).mean().backward()
    opt.step()
    return opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("config", [{"type": "AdamW"}, {"type": "SGD", "momentum": 0.9}, {"type": "AdamW", "foreach": True}])
def test_honest_state_of_every_shape_and_dtype_loads_and_steps_the_same(config, shape, dtype):
    """The checks refuse nothing honest: a round trip gives the same next step."""
    p = torch.nn.Parameter(torch.randn(shape, dtype=dtype))
    opt = optcore.build_optimizer(config, [p])
    p.grad = torch.randn_like(p)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    q = torch.nn.Parameter(p.detach().clone())
    other = optcore.build_optimizer(config, [q])
    other.load_state_dict(sd)
    p.grad, q.grad = torch.ones_like(p), torch.ones_like(q)
    opt.step()
    other.step()
    torch.testing.assert_close(q, p)


def test_torch_adafactor_factors_are_judged_by_their_factored_shapes():
    model = torch.nn.Linear(4, 5)
    sd = _stepped({"type": "torch:Adafactor"}, model).state_dict()
    optcore.build_optimizer({"type": "torch:Adafactor"}, model).load_state_dict(copy.deepcopy(sd))
    sd["state"][0]["row_var"] = torch.zeros(1, 1)  # broadcastable, not the row factor
    with pytest.raises(optcore.ConfigError, match=r"'row_var' has shape \(1, 1\), expected \(5, 1\)"):
        optcore.build_optimizer({"type": "torch:Adafactor"}, model).load_state_dict(sd)


def test_adafactor_checkpoint_of_another_model_is_refused_at_load():
    pytest.importorskip("optcore_adafactor")
    sd = _stepped({"type": "optcore-adafactor:Adafactor"}, torch.nn.Linear(4, 4)).state_dict()
    sd["optcore"]["param_shapes"] = {0: [6, 6], 1: [6]}
    opt = optcore.build_optimizer({"type": "optcore-adafactor:Adafactor"}, torch.nn.Linear(6, 6))
    with pytest.raises(optcore.ConfigError, match=r"'exp_avg_sq_row' has shape \(4,\), expected \(6,\)"):
        opt.load_state_dict(sd)
    assert not opt.state


ESCAPE = "\x1b[2J\x1b[31mred\x07"


def test_checkpoint_strings_reach_messages_and_warnings_escaped():
    model = torch.nn.Linear(3, 3)
    sd = _stepped({"type": "AdamW"}, model).state_dict()
    sd["optcore"]["version"] = ESCAPE
    with pytest.warns(UserWarning) as record:
        optcore.build_optimizer({"type": "AdamW"}, model).load_state_dict(sd)
    text = str(record[0].message)
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[31mred" in text
    sd["optcore"].update(name=ESCAPE, provider=ESCAPE)
    with pytest.raises(optcore.ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW"}, model).load_state_dict(sd)
    assert "\x1b" not in str(info.value) and "\x1b" not in repr(info.value.problems)
    sd = _stepped({"type": "AdamW"}, model).state_dict()
    sd["state"][0][ESCAPE] = torch.zeros(1)
    with pytest.raises(optcore.ConfigError) as info:
        optcore.build_optimizer({"type": "AdamW"}, model).load_state_dict(sd)
    assert "\x1b" not in str(info.value)


@pytest.mark.parametrize("value", [math.nan, -1, 2.5, math.inf, torch.tensor(-3.0), torch.tensor(math.nan), torch.tensor([1.0, 2.0])])
def test_a_step_count_that_is_not_a_whole_number_is_refused(value):
    model = torch.nn.Linear(3, 3)
    sd = _stepped({"type": "Adam", "fused": False}, model).state_dict()
    sd["state"][1]["step"] = value
    opt = optcore.build_optimizer({"type": "Adam", "fused": False}, model)
    with pytest.raises(optcore.ConfigError, match="'step'"):
        opt.load_state_dict(sd)
    assert not opt.state


@pytest.mark.parametrize("value", [0, 7, 7.0, torch.tensor(7.0), torch.tensor(7)])
def test_a_whole_step_count_loads(value):
    model = torch.nn.Linear(3, 3)
    sd = _stepped({"type": "Adam"}, model).state_dict()
    sd["state"][1]["step"] = value
    optcore.build_optimizer({"type": "Adam"}, model).load_state_dict(sd)


def test_a_closure_still_returns_its_loss_through_the_fused_check():
    model = torch.nn.Linear(4, 4)
    opt = _stepped({"type": "AdamW"}, model)
    assert opt.param_groups[0]["fused"]
    loss = opt.step(closure=lambda: model(torch.randn(2, 4)).sum().backward() or torch.tensor(1.5))
    assert loss == 1.5


# --------------------------------------------------------------- regexes

SLOW_PATTERNS = [r"^(.*.*.*.*.*.*.*.*)*\.bias_$", r"(a+)+$", r"^(\w+\.?)*x$", r"(.*a){12}$"]
GPT2_NAMES = [f"transformer.h.{i}.{part}" for i in range(12) for part in (
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "mlp.c_fc.weight",
)]


@pytest.mark.parametrize("pattern", SLOW_PATTERNS)
def test_a_backtracking_regex_matches_in_linear_time(pattern):
    """Python's re ran the first for over 150 s against these names."""
    from optcore._group_rules import match

    names = GPT2_NAMES + ["a" * 40 + "!", "transformer.wte.weight" * 20]
    start = time.perf_counter()
    with pytest.raises(optcore.ConfigError, match="matches no trainable parameter"):
        match(names, [{"params": pattern, "lr_scale": 0.5}], [])
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("pattern", [r"(a)\1", r"attn(?=\.c)", r"(?<!ln_)1\.", r"(?!mlp)attn", r"weight\Z"])
def test_a_regex_re2_cannot_take_is_refused_by_name(pattern):
    with pytest.raises(optcore.ConfigError, match=r"RE2.*Backreferences and lookahead/lookbehind") as info:
        optcore.plan({"type": "AdamW", "param_groups": [{"params": pattern, "lr_scale": 0.5}]})
    assert info.value.problems[0][0] == "param_groups[0].params"


@pytest.mark.parametrize("size", [MAX_PATTERN_LENGTH + 1, 10_000_000])
def test_an_oversized_regex_is_refused_at_once_by_its_length(size):
    """A 10 MB pattern took 11 s to refuse (Python's parser, then RE2's, read it all)."""
    start = time.perf_counter()
    with pytest.raises(optcore.ConfigError, match=f"is not a valid regex: it is {size:,} characters long") as info:
        optcore.plan({"type": "AdamW", "param_groups": [{"params": "a" * size, "lr_scale": 0.5}]})
    assert time.perf_counter() - start < 0.5
    assert info.value.problems[0][0] == "param_groups[0].params" and len(str(info.value)) < 1000


def test_a_regex_at_the_length_limit_still_matches(model):
    pattern = "^(" + "|".join(f"{i}" for i in (0, 3)) + r")\.weight$" + "|^zz" * ((MAX_PATTERN_LENGTH - 20) // 4)
    assert len(pattern) <= MAX_PATTERN_LENGTH
    opt = optcore.build_optimizer({"type": "AdamW", "param_groups": [{"params": pattern, "lr_scale": 0.5}]}, model)
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert lr[id(model[3].weight)] == pytest.approx(0.0005) and lr[id(model[3].bias)] == pytest.approx(0.001)


def test_a_regex_too_large_for_re2_is_refused_as_too_large_not_as_a_missing_feature():
    with pytest.raises(optcore.ConfigError, match=r"too large .*counted repetitions") as info:
        optcore.plan({"type": "AdamW", "param_groups": [{"params": ".{1,1000}" * 400, "lr_scale": 0.5}]})
    assert "Backreferences" not in str(info.value)


def test_an_invalid_regex_keeps_pythons_message():
    with pytest.raises(optcore.ConfigError, match=r"is not a valid regex: missing \), unterminated subpattern at position 0"):
        optcore.plan({"type": "AdamW", "param_groups": [{"params": "(attn", "lr_scale": 0.5}]})


def test_regex_groups_match_as_before(model):
    opt = optcore.build_optimizer(
        {"type": "AdamW", "param_groups": [{"params": r"^3\.(weight|bias)$", "lr_scale": 0.5}, {"params": r"^0\.w", "lr": 0.1}]},
        model,
    )
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert lr[id(model[3].weight)] == pytest.approx(0.0005) and lr[id(model[3].bias)] == pytest.approx(0.0005)
    assert lr[id(model[0].weight)] == 0.1 and lr[id(model[0].bias)] == pytest.approx(0.001)


# --------------------------------------------------------------- nesting


def _deep(levels):
    config = {"type": "AdamW", "lr": 1e-3}
    inner = config
    for _ in range(levels):
        inner["x"] = {}
        inner = inner["x"]
    return config


def _cyclic_dict():
    config = {"type": "AdamW"}
    config["self"] = config
    return config


def _cyclic_list():
    groups = [{"params": "^0", "lr_scale": 0.5}]
    groups.append(groups)
    return {"type": "AdamW", "param_groups": groups}


ENTRIES = {
    "build_optimizer": lambda cfg, model: optcore.build_optimizer(cfg, model),
    "plan": lambda cfg, model: optcore.plan(cfg),
    "build": lambda cfg, model: optcore.build({"optimizer": cfg}, model),
    "build_scheduler": lambda cfg, model: optcore.build_scheduler(
        {**cfg, "type": "cosine"}, optcore.build_optimizer("AdamW", model), num_training_steps=10
    ),
    "check": lambda cfg, model: _check_raises(cfg),
}


def _check_raises(cfg):
    from optcore.cli import check_config

    errors = check_config(cfg)
    if errors:
        raise optcore.ConfigError(errors[0])


@pytest.mark.parametrize("config", [lambda: _deep(2000), _cyclic_dict, _cyclic_list, lambda: _deep(70)], ids=["deep-2000", "cyclic-dict", "cyclic-list", "deep-70"])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_deep_or_cyclic_config_is_a_config_error_on_every_entry(entry, config, model):
    with pytest.raises(optcore.ConfigError, match="levels deep|contains itself") as info:
        ENTRIES[entry](config(), model)
    assert not isinstance(info.value.__context__, RecursionError)


def test_a_config_within_the_limits_of_files_still_builds(model):
    config = {"type": "AdamW", "param_groups": [{"params": "^0", "lr_scale": 0.5}]}
    shared = {"params": "^3", "lr_scale": 0.25}
    config["param_groups"] += [shared]  # shared, not cyclic
    optcore.build_optimizer(config, model)
    from optcore.files import MAX_DEPTH

    assert MAX_DEPTH == 64
    with pytest.raises(optcore.ConfigError, match="x: unknown field"):  # judged as any config, not by its depth
        optcore.plan(_deep(60))


# --------------------------------------------------------------- constructors


def test_systemexit_in_a_constructor_is_a_config_error_and_ctrl_c_still_stops(model):
    class Exits(torch.optim.SGD):
        def __init__(self, params, lr=0.1):
            raise SystemExit(3)

    class Interrupted(torch.optim.SGD):
        def __init__(self, params, lr=0.1):
            raise KeyboardInterrupt

    with pytest.raises(optcore.ConfigError, match="SystemExit"):
        optcore.build_optimizer({"type": Exits}, model)
    with pytest.raises(KeyboardInterrupt):
        optcore.build_optimizer({"type": Interrupted}, model)
