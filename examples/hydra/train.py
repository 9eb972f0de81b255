"""Hydra / OmegaConf: an optimizer config group, composed and built by optcore.

``conf/optimizer/*.yaml`` holds one file per optimizer, ``conf/lr_scheduler/*.yaml``
one per schedule; ``conf/config.yaml`` picks one of each. optcore takes the
composed ``DictConfig`` as it is (interpolations resolved), so the whole run
configuration goes straight to :func:`optcore.build`::

    optimizer, scheduler = optcore.build(cfg, model, num_training_steps=cfg.num_training_steps)

Run with Hydra (``pip install "optcore[hydra]"``)::

    python examples/hydra/train.py optimizer=sgd optimizer.momentum=0.95 lr_scheduler=constant
    python examples/hydra/train.py optimizer=lion '~lr_scheduler'      # no schedule

Without hydra-core installed the same command line works through
:func:`compose`, which does what Hydra's composition does for this
config with OmegaConf alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

import optcore

CONF = Path(__file__).resolve().parent / "conf"


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra-style ``overrides``
    (``group=option``, ``key.path=value``, ``~group`` to drop a group), with
    OmegaConf only."""
    root = OmegaConf.load(CONF / "config.yaml")
    choices: dict[str, str | None] = {}
    for entry in root.pop("defaults", []):
        if isinstance(entry, str):
            continue  # _self_: the root's own keys, merged last as below
        ((group, option),) = entry.items()
        choices[group] = option
    dotted = []
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key.startswith("~"):
            choices.pop(key[1:], None)
        elif key in choices:
            choices[key] = value
        else:
            dotted.append(f"{key}={value}")
    groups = {group: OmegaConf.load(CONF / group / f"{option}.yaml") for group, option in choices.items() if option}
    cfg = OmegaConf.merge(OmegaConf.create(groups), root, OmegaConf.from_dotlist(dotted))
    assert isinstance(cfg, DictConfig)
    return cfg


def run(cfg: DictConfig) -> float:
    """Train a small regressor with the configured optimizer and schedule; returns the final loss."""
    torch.manual_seed(cfg.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)

    optimizer, scheduler = optcore.build(cfg, model, num_training_steps=cfg.num_training_steps)
    for _ in range(cfg.num_training_steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    print(
        f"{cfg.optimizer.type} + {cfg.lr_scheduler.type if 'lr_scheduler' in cfg else 'no schedule'}: "
        f"final loss {loss.item():.4f}"
    )
    return loss.item()


if __name__ == "__main__":
    try:
        import hydra
    except ImportError:
        run(compose(sys.argv[1:]))
    else:
        hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")(run)()
