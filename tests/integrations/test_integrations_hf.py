"""optcore.integrations.hf with the real Hugging Face Trainer: the table from
``TrainingArguments.optim`` to optcore configs against the Trainer's own
choice, the two ways in, the warnings about TrainingArguments that do not
apply, unwrap through accelerate, and the lr a relative-step Adafactor logs.
Nothing is downloaded: the model is a one-layer GPT-2 built from a config."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import optcore

transformers = pytest.importorskip("transformers", reason="install optcore[hf] to test the Trainer integration")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (optcore[hf])")

from transformers import Trainer, TrainingArguments  # noqa: E402
from transformers.training_args import OptimizerNames  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402

from optcore.integrations import hf  # noqa: E402

from test_integrations import load_example  # noqa: E402  (a test file's own folder is on sys.path)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def example():
    return load_example("hf_trainer.py")


def args_for(tmp_path, **overrides) -> TrainingArguments:
    return TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", **overrides)


#: optim_args that move each installed optimizer off its defaults.
OPTIM_ARGS = {
    "sgd": "momentum=0.9, dampening=0.1, nesterov=False",
    "adagrad": "lr_decay=0.01, eps=1e-9",
    "rmsprop": "momentum=0.5, alpha=0.9, centered=True",
    "stable_adamw": "max_lr=0.01",
}


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Every group's hyper-parameters (not its tensors), in order."""
    return [{k: v for k, v in g.items() if k not in ("params", "initial_lr", "name")} for g in optimizer.param_groups]


def test_table_has_a_row_for_every_optim_name():
    assert set(hf.OPTIM_TABLE) == {name.value for name in OptimizerNames}
    for name, row in hf.OPTIM_TABLE.items():
        assert row.type is not None or row.note, name  # a row optcore cannot build says why


@pytest.mark.parametrize("name", [n.value for n in OptimizerNames])
def test_table_config_builds_what_the_trainer_builds(name, tmp_path, example):
    model = example.tiny_model()
    args = args_for(
        tmp_path,
        optim=name,
        optim_args=OPTIM_ARGS.get(name),
        learning_rate=3e-3,
        weight_decay=0.05,
        adam_beta1=0.8,
        adam_beta2=0.95,
        adam_epsilon=1e-7,
    )
    try:
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    except (ImportError, ValueError) as missing:  # the Trainer's own "install X" errors
        pytest.skip(f"{name}: {missing}")
    row = hf.OPTIM_TABLE[name]
    if row.type is None:
        with pytest.raises(optcore.ConfigError, match="optim_target_modules|constructor"):
            hf.config_from_training_args(args)
        return
    built = optcore.build_optimizer(hf.config_from_training_args(args), model)
    assert isinstance(built, cls)
    # The Trainer's optimizer: its class, its kwargs, its two groups (decay / no decay).
    decay = set(Trainer(model, args).get_decay_parameter_names(model))
    groups = [
        {"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0},
    ]
    reference = cls(groups, **kwargs)
    assert built.defaults == {**reference.defaults, "weight_decay": built.defaults["weight_decay"]}
    by_decay = {g["weight_decay"]: g for g in hyperparameters(built)}
    for group in hyperparameters(reference):
        assert by_decay[group["weight_decay"]] == group
    names = {id(p): n for n, p in model.named_parameters()}
    assert {g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in built.param_groups} == {
        g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in reference.param_groups
    }


def test_names_a_config_cannot_express_say_so(tmp_path):
    with pytest.raises(optcore.ConfigError, match="galore_adamw"):
        hf.config_from_training_args(args_for(tmp_path, optim="galore_adamw", optim_target_modules=["attn"]))


def test_optimizers_warns_about_training_arguments_that_do_not_apply(tmp_path, example):
    model = example.tiny_model()
    args = args_for(tmp_path, max_steps=10, learning_rate=1e-3, weight_decay=0.3)
    with pytest.warns(UserWarning, match=r"learning_rate=0.001 \(applies instead: the config's lr=0.02\)") as caught:
        optimizer, scheduler = hf.optimizers({"type": "AdamW", "lr": 2e-2}, model, args)
    assert "weight_decay=0.3" in str(caught[0].message)
    assert optimizer.get_lr() == 2e-2 and scheduler is None  # the config wins; the Trainer's schedule applies

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # defaults: nothing to say
        optimizer, scheduler = hf.optimizers(example.CONFIG, model, args_for(tmp_path, max_steps=10))
    assert scheduler is not None and scheduler.get_last_lr() == [0.0, 0.0]  # cosine warm-up over args.max_steps


def test_optimizer_cls_and_kwargs_checks_the_config_now():
    factory, kwargs = hf.optimizer_cls_and_kwargs({"optimizer": {"type": "SGD", "lr": 0.1}})
    assert kwargs == {"type": "SGD", "lr": 0.1}
    assert isinstance(factory()(torch.nn.Linear(2, 2), **kwargs), torch.optim.SGD)
    with pytest.raises(optcore.ConfigError, match="momentum"):
        hf.optimizer_cls_and_kwargs({"type": "SGD", "momentum": -1})
    with pytest.raises(optcore.ConfigError, match="lr_scheduler_type"):
        hf.optimizer_cls_and_kwargs({"optimizer": {"type": "SGD"}, "lr_scheduler": {"type": "cosine"}})


def test_factory_refuses_an_optimizer_without_lr():
    pytest.importorskip("optcore_adafactor")
    factory, kwargs = hf.optimizer_cls_and_kwargs({"type": "optcore-adafactor:Adafactor"})
    with pytest.raises(optcore.ConfigError, match="optimizers="):
        factory()(torch.nn.Linear(2, 2), **kwargs)


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_relative_step_adafactor_with_the_pass_through_schedule_logs_its_step_size(example, tmp_path, precision):
    """The config's own ``pass_through`` schedule (no AppliedLR): the Trainer logs
    the step size the optimizer applied, as transformers' AdafactorSchedule
    reports it, not ``None``; through a precision wrapper too."""
    pytest.importorskip("optcore_adafactor")
    model, args = example.tiny_model(), example.training_args(str(tmp_path), 3)
    optimizer = {"type": "optcore-adafactor:Adafactor", **({"precision": precision} if precision else {})}
    if precision:
        model = model.to(torch.bfloat16)
    config = {"optimizer": optimizer, "lr_scheduler": {"type": "pass_through"}}
    trainer = Trainer(model, args, train_dataset=example.RepeatingTokens(), optimizers=hf.optimizers(config, model, args))
    trainer.train()
    logged = [e["learning_rate"] for e in trainer.state.log_history if "loss" in e]
    adafactor = optcore.unwrap(trainer.optimizer)
    adafactor = getattr(adafactor, "optimizer", adafactor)  # inside the precision wrapper
    assert adafactor.param_groups[0]["lr"] is None
    assert len(logged) == 3 and all(isinstance(lr, float) and lr > 0 for lr in logged)
    assert logged[-1] == pytest.approx(adafactor.get_lrs()[0])
    # transformers' own schedule reports the same: the relative step size of the last step times max(eps2, RMS)
    state = adafactor.state[adafactor.param_groups[0]["params"][0]]
    assert logged[-1] == pytest.approx(float(transformers.optimization.Adafactor._get_lr(adafactor.param_groups[0], state)), rel=1e-5)


def test_unwrap_reaches_the_optcore_optimizer_inside_the_trainers_wrapper(example, tmp_path):
    trainer = example.train_with_optimizers(str(tmp_path), steps=2)
    wrapper = trainer.optimizer
    assert isinstance(wrapper, AcceleratedOptimizer)
    inner = optcore.unwrap(wrapper)
    assert type(inner).__module__.startswith("optcore_lion")
    assert inner.get_lr() == pytest.approx(trainer.lr_scheduler.get_last_lr()[0])
    total = inner.clip_grad_norm(0.0)  # measures only; grads were zeroed by the last step
    assert math.isfinite(float(total))
    assert {g["weight_decay"] for g in inner.param_groups} == {0.0, 0.1}


def test_relative_step_adafactor_logs_the_lr_it_applies(example, tmp_path):
    pytest.importorskip("optcore_adafactor")
    trainer = example.train_adafactor_relative_step(str(tmp_path), steps=3)
    assert isinstance(getattr(trainer.lr_scheduler, "scheduler", trainer.lr_scheduler), hf.AppliedLR)
    logged = [e["learning_rate"] for e in trainer.state.log_history if "loss" in e]
    assert len(logged) == 3 and all(isinstance(lr, float) and lr > 0 for lr in logged)
    inner = optcore.unwrap(trainer.optimizer)
    assert inner.param_groups[0]["lr"] is None  # still relative-step: the schedule changed nothing
    assert logged[-1] == pytest.approx(inner.get_lr())  # the step size applied at the last step


def _contract_through(trainer: Trainer) -> None:
    """The contract methods through ``trainer.optimizer`` (accelerate's wrapper) do
    what they do on the optcore optimizer inside."""
    wrapper, inner = trainer.optimizer, optcore.unwrap(trainer.optimizer)
    assert isinstance(wrapper, AcceleratedOptimizer) and wrapper is not inner
    assert wrapper.get_lr() == inner.get_lr() == pytest.approx(trainer.lr_scheduler.get_last_lr()[0])
    for flag in ("supports_memory_efficient_fp16", "supports_step_with_scale", "supports_flat_params", "supports_groups",
                 "sharding"):  # fmt: skip
        assert getattr(wrapper, flag) == getattr(inner, flag), flag
    assert wrapper.optimizer_config == inner.optimizer_config

    model = trainer.model
    wrapper.set_lr(0.01)
    assert inner.get_lr() == pytest.approx(0.01)
    batch = trainer.train_dataset[0]
    model(input_ids=batch["input_ids"][None], labels=batch["labels"][None]).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    total = torch.nn.utils.get_total_norm(list(grads.values()))
    torch.testing.assert_close(wrapper.clip_grad_norm(0.0), total)  # measures only
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    wrapper.step(scale=4.0)  # SGD: p -= lr * g / scale
    for n, p in model.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.detach(), before[n] - 0.01 * grads[n] / 4.0)
    wrapper.zero_grad()

    saved = wrapper.state_dict()
    wrapper.load_state_dict(saved, optimizer_overrides={"lr": 0.002})
    assert wrapper.get_lr() == pytest.approx(0.002) and inner.get_lr() == pytest.approx(0.002)


def test_the_contract_through_trainer_optimizer_with_optimizers(example, tmp_path):
    """``Trainer(optimizers=hf.optimizers(...), callbacks=[hf.ContractCallback()])``,
    as docs/integrations.md and examples/hf_trainer.py say."""
    config = {"optimizer": {"type": "SGD", "lr": 0.05}, "lr_scheduler": {"type": "cosine", "warmup_steps": 1}}
    trainer = example.train_with_optimizers(str(tmp_path), steps=2, config=config)
    assert trainer.state.global_step == 2
    _contract_through(trainer)


def test_the_contract_through_trainer_optimizer_with_the_factory(example, tmp_path):
    trainer = example.train_with_factory(str(tmp_path), steps=2, optimizer={"type": "SGD", "lr": 0.05})
    _contract_through(trainer)


def test_the_contract_callback_refuses_an_optimizer_optcore_did_not_build(example, tmp_path):
    model, args = example.tiny_model(), example.training_args(str(tmp_path), 1)
    trainer = Trainer(model, args, train_dataset=example.RepeatingTokens(), callbacks=[hf.ContractCallback()])
    with pytest.raises(optcore.ConfigError, match="No optcore optimizer inside AcceleratedOptimizer -> AdamW"):
        trainer.train()
    assert trainer.state.global_step == 0
