"""Hydra with the real hydra-core: ``_target_: optcore.build_optimizer`` with
``_partial_: true``, and both example scripts run through ``hydra.main`` in
a subprocess with command-line overrides (the tuple quoting included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import optcore

hydra = pytest.importorskip("hydra", reason="install optcore[hydra] to test the Hydra integration")
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HYDRA_EXAMPLES = ROOT / "examples" / "hydra"


def run_example(script: str, *overrides: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(HYDRA_EXAMPLES / script), f"hydra.run.dir={cwd}", *overrides],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_partial_build_optimizer_is_called_with_the_model(model):
    cfg = OmegaConf.create(
        {
            "_target_": "optcore.build_optimizer",
            "_partial_": True,
            "config": {"type": "SGD", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
        }
    )
    make = instantiate(cfg)
    optimizer = make(params_or_model=model)
    expected = optcore.build_optimizer({"type": "SGD", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, model)
    assert isinstance(optimizer, torch.optim.SGD)
    assert [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] == [
        {k: v for k, v in g.items() if k != "params"} for g in expected.param_groups
    ]  # the same groups as building directly: the no-decay group survives instantiate


def test_instantiate_example_takes_a_quoted_tuple_override(tmp_path):
    done = run_example(
        "instantiate.py",
        "num_training_steps=3",
        "optimizer.config.lr=1e-2",
        'optimizer.config.betas="(0.9, 0.95)"',
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "'betas': (0.9, 0.95)" in done.stdout and "'lr': 0.01" in done.stdout


def test_an_unquoted_tuple_is_a_hydra_grammar_error(tmp_path):
    done = run_example("instantiate.py", "optimizer.config.betas=(0.9, 0.95)", cwd=tmp_path)
    assert done.returncode != 0 and "override" in done.stderr.lower()


def test_train_example_runs_through_hydra_main_with_group_overrides(tmp_path):
    done = run_example(
        "train.py",
        "optimizer=sgd",
        "optimizer.momentum=0.5",
        "lr_scheduler=constant",
        "num_training_steps=5",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "SGD + constant_with_warmup: final loss" in done.stdout
