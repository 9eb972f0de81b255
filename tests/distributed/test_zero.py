"""optcore.distributed.zero_redundancy: ZeRO-1 that steps what build_optimizer builds."""

from __future__ import annotations

import pytest
import torch

import optcore
from optcore.distributed import zero_redundancy

from _dist_util import run_ranks

pytestmark = pytest.mark.distributed

CONFIG = {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1, "param_groups": [{"params": r"^2\.", "lr_scale": 0.5}]}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)) for _ in range(steps)]


def _train(opt, model, steps: int) -> list[torch.Tensor]:
    for x, y in _batches(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _sharded(rank: int, world: int, config: dict) -> dict:
    model = _model()
    zero = zero_redundancy(config, model)
    assert optcore.unwrap(zero) is zero  # the contract spans the ranks
    info = {
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in zero.param_groups],
        "local_class": type(zero.optim).__name__,
        "fused": [g.get("fused") for g in zero.optim.param_groups],
    }
    info["params"] = _train(zero, model, 5)
    return info


def test_zero_redundancy_equals_the_unsharded_build():
    model = _model()
    reference = optcore.build_optimizer(dict(CONFIG), model)
    expected_groups = [{k: v for k, v in g.items() if k != "params"} for g in reference.param_groups]
    expected = _train(reference, model, 5)
    results = run_ranks(_sharded, 2, dict(CONFIG))
    for info in results:
        assert [g["weight_decay"] for g in info["groups"]] == [g["weight_decay"] for g in expected_groups]
        assert [g["lr"] for g in info["groups"]] == pytest.approx([g["lr"] for g in expected_groups])
        assert info["local_class"] == "AdamW" and all(info["fused"])  # the plan's fused choice, on each shard
        for got, want in zip(info["params"], expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


#: every shipped optimizer ZeRO's whole-tensor shards leave exact, with the plugin it comes from
SHIPPED = {
    "SGD": ({"type": "SGD", "lr": 0.1, "momentum": 0.9}, None),
    "Lion": ({"type": "optcore-lion:Lion", "lr": 1e-3, "weight_decay": 0.1}, "optcore-lion"),
    "Adafactor": (
        {"type": "optcore-adafactor:Adafactor", "lr": 1e-2, "relative_step": False, "scale_parameter": False,
         "weight_decay": 0.01},
        "optcore-adafactor",
    ),
}


def _installed(config: dict) -> bool:
    try:
        optcore.resolve(config["type"]).target
    except (optcore.OptimizerNotFoundError, optcore.PluginLoadError):
        return False
    return True


def _clipped_steps(opt, model, steps: int, max_norm: float) -> tuple[list[torch.Tensor], list[float]]:
    norms = []
    for x, y in _batches(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        norms.append(float(opt.clip_grad_norm(max_norm)))
        opt.step()
    return [p.detach().clone() for p in model.parameters()], norms


def _contract_worker(rank: int, world: int, configs: dict) -> dict:
    """Each rank trains on the same batch (as after DDP's all-reduce) with the
    contract of the ZeRO optimizer: lr set and read, gradients clipped."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    out: dict = {}
    for name, config in configs.items():
        model = _model()
        zero = zero_redundancy(config, model)
        zero.set_lr(zero.get_lr() * 0.5)
        out[name] = {"lr": zero.get_lr(), "lrs": zero.get_lrs()}
        out[name]["params"], out[name]["norms"] = _clipped_steps(zero, model, 3, 0.05)
        out[name]["local_lrs"] = [g["lr"] for g in zero.optim.param_groups]
    # ZeroRedundancyOptimizer built by hand: the rank's optimizer that unwrap finds measures all shards
    model = _model()
    hand = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optcore.plugin.adapt(torch.optim.SGD), lr=0.1)
    local = optcore.unwrap(hand)
    assert local is hand.optim
    hand.zero_grad()
    x, y = _batches(1)[0]
    torch.nn.functional.mse_loss(model(x), y).backward()
    out["hand"] = {"norm": float(local.clip_grad_norm(0.0)), "shard_params": sum(p.numel() for g in local.param_groups for p in g["params"])}
    try:
        local.average_params()
    except optcore.ConfigError as exc:
        out["hand"]["average"] = str(exc)
    # average_params: ranks that drifted apart end at the mean of all parameters
    model = _model()
    zero = zero_redundancy(CONFIG, model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(rank))
    zero.average_params()
    out["averaged"] = [p.detach().clone() for p in model.parameters()]
    return out


def test_what_zero_redundancy_returns_keeps_the_contract_over_all_ranks():
    configs = {"AdamW": CONFIG, **{n: c for n, (c, _) in SHIPPED.items() if _installed(c)}}
    expected = {}
    for name, config in configs.items():
        model = _model()
        opt = optcore.build_optimizer(config, model)
        opt.set_lr(opt.get_lr() * 0.5)
        params, norms = _clipped_steps(opt, model, 3, 0.05)
        expected[name] = {"lr": opt.get_lr(), "lrs": opt.get_lrs(), "params": params, "norms": norms}
    model = _model()
    x, y = _batches(1)[0]
    torch.nn.functional.mse_loss(model(x), y).backward()
    full_norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    results = run_ranks(_contract_worker, 2, configs, timeout=240)
    for rank, info in enumerate(results):
        for name, want in expected.items():
            got = info[name]
            assert got["lr"] == pytest.approx(want["lr"]) and got["lrs"] == pytest.approx(want["lrs"]), name
            assert got["local_lrs"] == pytest.approx(want["lrs"]), name  # set_lr reached the shard
            assert got["norms"] == pytest.approx(want["norms"], rel=1e-5), name  # the norm over all ranks
            assert want["norms"][0] > 0.05  # the clip acted
            for a, b in zip(got["params"], want["params"]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        assert info["hand"]["norm"] == pytest.approx(full_norm, rel=1e-5)
        assert info["hand"]["shard_params"] < sum(p.numel() for p in model.parameters())  # a shard's norm would be smaller
        assert "zero_redundancy returns" in info["hand"]["average"]
        for got, start in zip(info["averaged"], _model().parameters()):
            torch.testing.assert_close(got, start + 0.5)  # the mean of +0 and +1


def test_zero_redundancy_refuses_a_global_optimizer_before_any_collective():
    if not _installed({"type": "optcore-adascale:AdaScaleSGD"}):
        pytest.skip("optcore-adascale is not installed")
    config = {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "num_gradients_to_accumulate": 2}
    with pytest.raises(optcore.ConfigError, match=r"sharding='global'.*DDP"):
        zero_redundancy(config, _model())  # no process group: it fails before ZeRO is made


class _Undeclared(torch.optim.SGD):
    """A user's subclass: optcore cannot vouch for how its update couples elements."""


def test_zero_redundancy_refuses_an_optimizer_of_unknown_sharding():
    optcore.register_optimizer("ZeroUndeclared", _Undeclared)
    try:
        with pytest.raises(optcore.ConfigError, match=r"sharding='unknown'.*declares sharding = 'elementwise'"):
            zero_redundancy({"type": "ZeroUndeclared", "lr": 0.1}, _model())
    finally:
        optcore.unregister_optimizer("ZeroUndeclared")


def test_zero_redundancy_refuses_wrappers_before_any_collective():
    if not any(s.name == "FP16Optimizer" for s in optcore.list_optimizers()):
        pytest.skip("optcore-fp16 is not installed")
    with pytest.raises(optcore.ConfigError, match="shards plain optimizers"):
        zero_redundancy({"type": "SGD", "precision": "bf16"}, _model().bfloat16())


@pytest.mark.parametrize(
    "config",
    [
        {"type": "torch:Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 1e-2}},
        {"type": "AdamW", "lr": 1e-2, "param_groups": [{"params": "bias", "optimizer": {"type": "SGD", "lr": 0.1}}]},
    ],
    ids=["Muon+AdamW", "AdamW+SGD"],
)
def test_zero_redundancy_refuses_a_composite_by_name_before_any_collective(config):
    """ZeRO builds one optimizer class per rank: a composite's groups would all be
    stepped by its main type (torch's Muon raised on the first 1-D bias)."""
    with pytest.raises(optcore.ConfigError, match=r"is a composite \(.*AdamW.*\).*ONE optimizer class.*DDP"):
        zero_redundancy(config, _model())  # no process group: it fails before ZeRO is made


def test_unwrap_finds_the_optimizer_or_says_what_it_found():
    opt = optcore.build_optimizer("SGD", _model())
    assert optcore.unwrap(opt) is opt

    class Wrapper:  # the shape of accelerate's and Lightning's wrappers
        def __init__(self, inner):
            self._optimizer = inner

        @property
        def param_groups(self):
            return self._optimizer.param_groups

    assert optcore.unwrap(Wrapper(Wrapper(opt))) is opt
    plain = torch.optim.SGD(_model().parameters(), lr=0.1)
    with pytest.raises(optcore.ConfigError, match="No optcore optimizer inside Wrapper -> SGD"):
        optcore.unwrap(Wrapper(plain))


def _hand_built_global_worker(rank: int, world: int) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optcore_adascale import AdaScaleSGD

    model = _model()
    ddp = DDP(model)
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=AdaScaleSGD, lr=0.1, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batches(1)[0]
    torch.nn.functional.mse_loss(ddp(x[rank::2]), y[rank::2]).backward()
    try:
        zero.step()
    except optcore.ConfigError as exc:
        error = str(exc)
    else:
        error = None
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return {"error": error, "moved": moved}


def test_a_hand_built_zero_around_a_global_optimizer_fails_at_its_first_step():
    if not _installed({"type": "optcore-adascale:AdaScaleSGD"}):
        pytest.skip("optcore-adascale is not installed")
    for info in run_ranks(_hand_built_global_worker, 2):
        assert info["error"] is not None, "AdaScaleSGD stepped ZeRO's shards silently"
        assert "sharding='global'" in info["error"] and "ranks step different parameters" in info["error"]
        assert "zero_redundancy" in info["error"] and "DDP" in info["error"]
        assert not info["moved"]


# ------------------------------------------------------------------ ZeRO built by hand: the groups are what it is given
NO_DECAY_CONFIG = {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1}


def _hand_built_groups_worker(rank: int, world: int) -> dict:
    """Hand-built ZeRO under DDP on half the batch: over ``model.parameters()``
    with a class and its keyword arguments, and over the plan's own groups."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    def run(make) -> list[torch.Tensor]:
        model = _model()
        ddp, zero = DDP(model), make(model)
        for x, y in _batches(5):
            zero.zero_grad()
            torch.nn.functional.mse_loss(ddp(x[rank::world]), y[rank::world]).backward()
            zero.step()
        return [p.detach().clone() for p in model.parameters()]

    def planned(model: torch.nn.Module):
        built = optcore.plan(dict(NO_DECAY_CONFIG), model)
        groups = [dict(g) for g in built.groups]
        return ZeroRedundancyOptimizer(groups, optimizer_class=built.spec.target, **built.hparams)

    out = {"plan's groups": run(planned)}
    for label, config in _CLASS_ROUTES.items():
        if _installed(config):
            cls = optcore.resolve(config["type"]).target
            out[label] = run(lambda m, cls=cls: ZeroRedundancyOptimizer(
                m.parameters(), optimizer_class=cls, lr=1e-2, weight_decay=0.1))
    return out


#: classes handed to ZeRO by hand: torch's own and a plugin's (optcore-lion's contract class)
_CLASS_ROUTES = {"torch AdamW class": {"type": "torch:AdamW"}, "optcore-lion class": {"type": "optcore-lion:Lion"}}


def test_a_hand_built_zero_steps_the_groups_it_is_given():
    """ZeRO's ``optimizer_class`` route is torch's ``cls(params, **kwargs)`` on each
    shard: over ``model.parameters()`` every parameter is decayed, exactly as the
    same call on one process (optcore never sees a config or a name there). The
    plan's groups reach ZeRO by hand too: ``optcore.plan(config, model).groups``
    as its params give what ``build_optimizer(config, model)`` gives."""
    planned_model = _model()
    want_planned = _train(optcore.build_optimizer(dict(NO_DECAY_CONFIG), planned_model), planned_model, 5)
    results = run_ranks(_hand_built_groups_worker, 2, timeout=240)
    for rank, info in enumerate(results):
        for a, b in zip(info["plan's groups"], want_planned):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, r=rank: f"rank {r}, plan's groups: {m}")
        assert "torch AdamW class" in info
        for label in set(info) - {"plan's groups"}:
            model = _model()
            cls = optcore.resolve(_CLASS_ROUTES[label]["type"]).target
            want = _train(cls(model.parameters(), lr=1e-2, weight_decay=0.1), model, 5)
            for a, b in zip(info[label], want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, r=rank, k=label: f"rank {r}, {k}: {m}")
        # the class route is not the plan: LayerNorm's weight (1.0 at the start) decays there and not in the plan
        assert (info["torch AdamW class"][2] - want_planned[2]).abs().max() > 1e-3
