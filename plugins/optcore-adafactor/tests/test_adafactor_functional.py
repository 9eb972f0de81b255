"""The functional update on its own: one step equals transformers' step, and
a parameter split into row shards, each stepped by its own caller with a
``mean`` that all-reduces across them, takes the step the whole one takes."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import Tensor

from optcore_adafactor import adafactor_update
from optcore_adafactor.functional import state_shapes

hf = pytest.importorskip("transformers.optimization")

HPARAMS = dict(lr=None, eps1=1e-30, eps2=1e-3, clip_threshold=1.0, decay_rate=-0.8, weight_decay=0.01,
               scale_parameter=True, relative_step=True, warmup_init=False)


def _state(p: Tensor, beta1: float | None) -> dict[str, Tensor | None]:
    state: dict[str, Tensor | None] = dict.fromkeys(("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq", "exp_avg"))
    state.update({k: torch.zeros(s) for k, s in state_shapes(p, beta1).items()})
    return state


def _step(p: Tensor, g: Tensor, state: dict, rms: Tensor, t: int, beta1: float | None, **kw: object) -> None:
    adafactor_update(p, g, state["exp_avg_sq_row"], state["exp_avg_sq_col"], state["exp_avg_sq"], state["exp_avg"],
                     rms, step=t, beta1=beta1, **HPARAMS, **kw)


@pytest.mark.parametrize("shape", [(12, 7), (3, 4, 5), (9,)])
@pytest.mark.parametrize("beta1", [None, 0.9])
def test_steps_equal_transformers(shape: tuple[int, ...], beta1: float | None) -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(shape, generator=gen)
    ref = p.clone().requires_grad_()
    ref_opt = hf.Adafactor([ref], beta1=beta1, weight_decay=0.01)
    state, rms = _state(p, beta1), torch.zeros(())
    for t in range(1, 11):
        g = torch.randn(shape, generator=gen)
        ref.grad = g.clone()
        ref_opt.step()
        _step(p, g * 8.0, state, rms, t, beta1, inv_scale=1 / 8.0)  # a loss scale of 8, folded in
        torch.testing.assert_close(p, ref.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rms, ref_opt.state[ref]["RMS"], rtol=1e-5, atol=0)


class _RowShards:
    """Two callers, each holding half the rows of an n x m parameter, whose
    ``mean`` all-reduces over them where a reduction crosses rows: a stand-in
    for a process group's all_reduce, with threads."""

    def __init__(self, n: int, m: int) -> None:
        self.n, self.m = n, m
        self.parts: list[Tensor | None] = [None, None]
        self.barrier = threading.Barrier(2)

    def mean_of(self, rank: int):  # noqa: ANN201 - a Mean
        def mean(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
            if dim == -1:  # along a row: every row is whole on its shard
                return x.mean(dim, keepdim=keepdim)
            self.parts[rank] = x.sum() if dim is None else x.sum(dim, keepdim=keepdim)
            self.barrier.wait()
            total = self.parts[0] + self.parts[1]  # type: ignore[operator]
            self.barrier.wait()
            return total / (self.n * self.m if dim is None else self.n)

        return mean


@pytest.mark.parametrize("beta1", [None, 0.9])
def test_row_shards_with_an_all_reducing_mean_take_the_whole_step(beta1: float | None) -> None:
    n, m = 10, 6
    gen = torch.Generator().manual_seed(1)
    whole = torch.randn(n, m, generator=gen)
    shards = [whole[: n // 2].clone(), whole[n // 2 :].clone()]
    state, rms = _state(whole, beta1), torch.zeros(())
    shard_states = [_state(s, beta1) for s in shards]  # rows split, columns replicated
    shard_rms = [torch.zeros(()), torch.zeros(())]
    group = _RowShards(n, m)
    for t in range(1, 6):
        g = torch.randn(n, m, generator=gen)
        _step(whole, g, state, rms, t, beta1)
        threads = [
            threading.Thread(target=_step, args=(shards[r], g[r * n // 2 : (r + 1) * n // 2], shard_states[r],
                                                 shard_rms[r], t, beta1), kwargs={"mean": group.mean_of(r)})
            for r in range(2)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        torch.testing.assert_close(torch.cat(shards), whole, rtol=1e-6, atol=1e-7)
        for r in range(2):
            torch.testing.assert_close(shard_states[r]["exp_avg_sq_col"], state["exp_avg_sq_col"], rtol=1e-6, atol=0)
            torch.testing.assert_close(shard_rms[r], rms, rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.cat([s["exp_avg_sq_row"] for s in shard_states]), state["exp_avg_sq_row"])
