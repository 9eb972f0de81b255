"""Run in a child process by test_layer_decay_timm.py: timm's layer-decay groups
and optcore's ``layer_decay`` groups for timm's own models, as JSON on stdout.

timm imports torchvision when it is imported (FrozenBatchNorm2d, transforms,
datasets), and PyPI's torchvision does not import beside torch's CPU wheel
(its C extension links torch's CUDA libraries). Where the real torchvision
does not import, a stand-in takes its place in this process only: a module
whose every name is a class that raises when used. Nothing timm runs here uses
one (building a model and grouping its parameters does not), so the groups
are timm's own; a stand-in that were used would fail the run, not fake it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import types


def _install_torchvision_standin() -> bool:
    try:
        import torchvision  # noqa: F401
        from torchvision.ops.misc import FrozenBatchNorm2d  # noqa: F401
    except Exception:  # noqa: BLE001  ModuleNotFoundError, or "operator torchvision::nms does not exist"
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    else:
        return False

    class Used(RuntimeError):
        pass

    class Meta(type):
        def __getattr__(cls, name: str) -> str:
            if name.startswith("__"):
                raise AttributeError(name)
            return f"{cls.__name__}.{name}"  # enum members read at import time (InterpolationMode.NEAREST)

    class Placeholder(metaclass=Meta):
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise Used(f"the torchvision stand-in's {type(self).__name__} was used")

    class Module(types.ModuleType):
        def __getattr__(self, name: str) -> type:
            if name.startswith("__"):
                raise AttributeError(name)
            value = Meta(name, (Placeholder,), {"__module__": self.__name__})
            setattr(self, name, value)
            return value

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
            if fullname == "torchvision" or fullname.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
            module = Module(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module: types.ModuleType) -> None:
            pass

    sys.meta_path.insert(0, Finder())
    return True


#: (timm model, create_model kwargs, parameters frozen by prefix)
CASES = [
    ("vit_tiny_patch16_224", {}, ()),
    ("vit_tiny_patch16_224", {"init_values": 1e-5, "depth": 4}, ()),  # LayerScale: 1-D gammas, no decay
    ("deit_tiny_distilled_patch16_224", {"depth": 3}, ("patch_embed.",)),  # dist_token; a frozen stem
    ("resnet18", {}, ()),
    ("convnext_atto", {}, ()),
    ("efficientnet_b0", {}, ()),
]
LAYER_DECAY, WEIGHT_DECAY, LR = 0.75, 0.05, 1e-3


def main() -> None:
    standin = _install_torchvision_standin()
    import timm
    from timm.optim import create_optimizer_v2
    from timm.optim._param_groups import param_groups_layer_decay

    import optcore

    out = {"timm": timm.__version__, "torchvision_standin": standin, "cases": []}
    for name, kwargs, frozen in CASES:
        model = timm.create_model(name, pretrained=False, **kwargs)
        for n, p in model.named_parameters():
            if frozen and n.startswith(frozen):
                p.requires_grad_(False)
        names = {id(p): n for n, p in model.named_parameters()}
        # the arguments create_optimizer_v2(model, layer_decay=...) passes
        reference = param_groups_layer_decay(
            model, weight_decay=WEIGHT_DECAY, layer_decay=LAYER_DECAY,
            no_weight_decay_list=model.no_weight_decay() if hasattr(model, "no_weight_decay") else (),
        )  # fmt: skip
        timm_optimizer = create_optimizer_v2(model, "adamw", lr=LR, weight_decay=WEIGHT_DECAY, layer_decay=LAYER_DECAY)
        built = optcore.build_optimizer(
            {"type": "AdamW", "lr": LR, "weight_decay": WEIGHT_DECAY, "layer_decay": LAYER_DECAY}, model
        )

        def shown(groups: list[dict], names: dict[int, str] = names, lr: bool = False) -> list[dict]:
            keys = ("lr_scale", "weight_decay", "lr") if lr else ("lr_scale", "weight_decay")
            return [{"params": [names[id(p)] for p in g["params"]], **{k: g[k] for k in keys}} for g in groups]

        out["cases"].append({
            "model": name, "kwargs": kwargs,
            "timm": shown(reference), "timm_create_optimizer_v2": shown(timm_optimizer.param_groups),
            "optcore": shown(built.param_groups, lr=True),
            "optcore_names": [g.get("name") for g in built.param_groups],
            "get_lr": built.get_lr(),
            "trainable": sum(1 for p in model.parameters() if p.requires_grad),
        })  # fmt: skip
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
