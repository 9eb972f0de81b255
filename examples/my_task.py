"""Your own model and data in ``optcore compare``: a task is an object with
``name``, ``describe``, ``model``, ``batches``, ``heldout`` and ``loss``
(the protocol in ``optcore.compare.tasks``).

    optcore compare --task examples/my_task.py:task --optimizers AdamW,SGD,Lion --seeds 0,1,2
    optcore compare --task my_package.my_module:task ...      # when importable

This one: a 2-layer MLP regresses a fixed random smooth function of 8 inputs,
with noise. Swap in your model, a slice of your data and your loss; keep a
run to a few seconds per optimizer so that seeds and an lr sweep stay cheap.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

INPUTS, BATCH = 8, 64


class RegressionTask:
    name = "mlp-regression"
    loss_label = "mean squared error"

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)  # the target function is the same in every run
        self.w1 = torch.randn(INPUTS, 32, generator=g)
        self.w2 = torch.randn(32, 1, generator=g) / 32**0.5

    def describe(self) -> str:
        return f"MLP regression of a random function of {INPUTS} inputs, batch {BATCH}"

    def model(self) -> nn.Module:
        # called after torch.manual_seed(seed): every optimizer starts from the same weights
        return nn.Sequential(nn.Linear(INPUTS, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

    def _batch(self, g: torch.Generator) -> tuple[Tensor, Tensor]:
        x = torch.randn(BATCH, INPUTS, generator=g)
        y = torch.tanh(x @ self.w1) @ self.w2 + 0.05 * torch.randn(BATCH, 1, generator=g)
        return x, y

    def batches(self, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(seed)
        while True:
            yield self._batch(g)

    def heldout(self, seed: int) -> list[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(1_000_003 + seed)
        return [self._batch(g) for _ in range(4)]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y)


task = RegressionTask  # --task examples/my_task.py:task (a class is instantiated with no arguments)


def make_model() -> nn.Module:
    """The same model for ``optcore memory --model examples/my_task.py:make_model``
    (built on the meta device there: nothing is allocated)."""
    return RegressionTask().model()
