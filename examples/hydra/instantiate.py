"""Hydra's ``instantiate``: ``_target_: optcore.build_optimizer`` with ``_partial_: true``.

``conf/instantiate.yaml`` names optcore's builder as the target; Hydra makes a
``functools.partial`` of it with the config, and the script supplies the
parameters once the model exists::

    make_optimizer = hydra.utils.instantiate(cfg.optimizer)
    optimizer = make_optimizer(params_or_model=model)

Pass the model by keyword (``params_or_model=``): the partial already holds
``config``. Override from the command line; a tuple is a string for Hydra's
grammar, so quote it twice (the shell's quotes around Hydra's)::

    python examples/hydra/instantiate.py optimizer.config.type=SGD optimizer.config.lr=0.05 \\
        '~optimizer.config.betas' +optimizer.config.momentum=0.9
    python examples/hydra/instantiate.py 'optimizer.config.betas="(0.9, 0.95)"'

(``[0.9,0.95]``, a Hydra list, works as well; optcore parses the string safely,
never with ``eval``.) Needs ``pip install "optcore[hydra]"``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

CONF = Path(__file__).resolve().parent / "conf"


def run(cfg: DictConfig) -> float:
    """Train a small regressor with the instantiated optimizer; returns the final loss."""
    torch.manual_seed(cfg.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x = torch.randn(128, 8)
    y = x @ torch.randn(8, 1)
    optimizer = instantiate(cfg.optimizer)(params_or_model=model)
    for _ in range(cfg.num_training_steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"{type(optimizer).__name__} {dict(sorted(optimizer.optimizer_config.items()))}")
    print(f"final loss {loss.item():.4f}")
    return loss.item()


if __name__ == "__main__":
    hydra.main(config_path=str(CONF), config_name="instantiate", version_base="1.3")(run)()
