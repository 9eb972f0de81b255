"""``optcore memory``: the bytes a training run of a model holds per optimizer
config (optimizer state, fp32 master copies, gradients, parameters), without
allocating the model.

Exact, not a rule of thumb: each config's optimizer is built for the model's
parameters on the meta device (shapes and dtypes, no data), a backward pass and
one step initialise its state, and :func:`~optcore.compare.probes.optimizer_state_bytes`
counts it (the same count ``optcore compare`` measures after real training).
Values the step reads back as Python numbers (``.item()``) have no data on the
meta device; :class:`MetaScalars` answers them as for finite gradients. A
state whose size depends on values (LBFGS's history) is reported, not guessed.
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

import optcore
from optcore import ConfigError, resolve

from .._config import typed_config
from ..composite import CompositeOptimizer, StepInBackward
from .. import kernels
from .._contract import ContractMixin
from .lineup import built_name
from .metascalars import MetaScalars, ItemsInKernels
from .precision import param_dtype, with_precision
from .probes import _count, _tensors, optimizer_state_bytes
from .transient import FusedKernels, LiveStorages

# ------------------------------------------------------------------ models
def parse_count(text: str) -> int:
    """``"7B"``, ``"125M"``, ``"1.5e9"``, ``"350000"`` -> a parameter count."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kKmMbBtT]?)\s*", text)
    if not m:
        raise ConfigError(f"--params takes a count like 7B, 125M or 350000, got {text!r}.", problems=[("params", text)])
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m[2].lower()]
    count = int(round(float(m[1]) * scale))
    if count < 1:
        raise ConfigError(f"--params must be at least 1, got {text!r}.", problems=[("params", text)])
    return count


class FlatParams(nn.Module):
    """``count`` parameters as one flat tensor, or (``as_matrix``) as one matrix
    of the same size: the twin that shows whether a state depends on shapes."""

    def __init__(self, count: int, as_matrix: bool = False) -> None:
        super().__init__()
        cols = math.gcd(count, 1024) if as_matrix else 0
        self.weight = nn.Parameter(torch.empty((count // cols, cols) if cols else (count,)))


def factory_from_spec(spec: str) -> Callable[[], nn.Module]:
    """``package.module:fn`` or ``path/to/file.py:fn``: a function returning a model."""
    from .tasks import _import

    module_name, sep, attr = spec.rpartition(":")
    if not sep:
        raise ConfigError(f"--model takes package.module:fn or path/to/file.py:fn, got {spec!r}.",
                          problems=[("model", spec)])  # fmt: skip
    fn = getattr(_import(module_name, spec), attr, None)
    if not callable(fn):
        raise ConfigError(f"--model {spec!r}: {module_name} has no function {attr!r}.", problems=[("model", spec)])
    return fn


#: a transformers config.json is a few KiB; layers: the largest published models have a few hundred
MAX_HF_CONFIG_BYTES = 1024 * 1024
MAX_HF_LAYERS = 4096


def factory_from_hf_config(path: str) -> Callable[[], nn.Module]:
    """A ``transformers`` model from its ``config.json`` (or the folder holding it), no weights."""
    try:
        import transformers
    except ImportError:
        raise ConfigError("--hf-config needs transformers: pip install transformers.") from None
    from pathlib import Path

    from .._values import clean_text

    shown = clean_text(path, 300)
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    if file.is_file() and file.stat().st_size > MAX_HF_CONFIG_BYTES:
        raise ConfigError(f"--hf-config {shown!r}: over {MAX_HF_CONFIG_BYTES // 1024} KiB, not a transformers "
                          "config.json.", problems=[("hf-config", "too large")])  # fmt: skip
    try:  # trust_remote_code stays off: a config's auto_map names code, which is not run
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers' own validation raises its own classes (huggingface_hub's)
        raise ConfigError(f"--hf-config {shown!r}: cannot read it as a transformers config "
                          f"({type(exc).__name__}: {clean_text(exc, 300)}).") from None  # fmt: skip
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        layers = getattr(config, key, None)
        if isinstance(layers, int) and not 0 <= layers <= MAX_HF_LAYERS:
            raise ConfigError(f"--hf-config {shown!r}: {key} = {layers}, over the {MAX_HF_LAYERS} layers any model "
                              "has; building it would not end in reasonable time.",
                              problems=[(key, "too many layers")])  # fmt: skip

    def build() -> nn.Module:
        try:  # initialising weights is most of the build time, and meta tensors have none to set
            from transformers.initialization import no_init_weights
        except ImportError:
            import contextlib

            no_init_weights = contextlib.nullcontext
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
            try:
                with no_init_weights():
                    return auto.from_config(config)
            except ValueError:
                continue
            except (TypeError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError,
                    RuntimeError) as exc:  # a config.json of values the model cannot be built from
                raise ConfigError(f"--hf-config {shown!r}: transformers cannot build {type(config).__name__} from it "
                                  f"({type(exc).__name__}: {clean_text(exc, 300)}).") from None  # fmt: skip
        raise ConfigError(f"--hf-config {shown!r}: transformers has no model class for {type(config).__name__}.")

    return build


def on_meta(factory: Callable[[], nn.Module], dtype: torch.dtype | None = None) -> nn.Module:
    """``factory()`` with every tensor on the meta device: shapes only, nothing allocated."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = factory()
    if not isinstance(model, nn.Module):
        raise ConfigError(f"The model factory returned {type(model).__name__}, not a torch.nn.Module.")
    return model.to(dtype=dtype) if dtype is not None else model


# -------------------------------------------------------------- prediction
def _accumulations(optimizer_cfg: Any) -> int:
    """Backward passes per step the config asks for (AdaScale estimates from several)."""
    value = typed_config(optimizer_cfg).get("num_gradients_to_accumulate", 1)
    return int(value) if isinstance(value, int) and value > 1 else 1


def _unpredictable(optimizer_cfg: Any) -> str | None:
    """Why this optimizer's state cannot be predicted, if it cannot."""
    from optcore.testing import inputs_for

    try:
        spec = resolve(typed_config(optimizer_cfg)["type"])
        inputs = inputs_for(spec)
    except Exception:  # noqa: BLE001 - the build reports a bad name with its own message
        return None
    if inputs.needs_closure:
        return "its state grows with the closure's evaluations (a history of steps): not predicted"
    if "*" in inputs.skip and _accumulations(optimizer_cfg) == 1:  # the step here accumulates as configured
        return (f"not predicted: {inputs.skip['*']}; a config that accumulates (num_gradients_to_accumulate: 2 "
                "or more, in a --config entry) is predicted")
    return None


def step_on(model: nn.Module | None, optimizer: Any, accumulations: int = 1, mode: Any = None, watch: Any = None,
            params: list[Tensor] | None = None) -> None:  # fmt: skip
    """Step ``optimizer`` as training does: ``accumulations`` backward passes and
    one step (under ``mode``, e.g. :class:`MetaScalars`; ``watch`` around the step
    alone, e.g. :class:`~optcore.compare.transient.LiveStorages`). On the meta
    device a plugin's C kernel stands in for itself (:func:`optcore.kernels.predicting`):
    the prediction takes the path a CPU step takes. The backward
    runs when something watches it (a precision wrapper's own ``backward`` scales
    the loss there; AdaScale's gradient hooks measure it); otherwise the gradients
    are set directly, which on the meta device costs nothing. ``params`` are the
    trained parameters (default: ``model``'s); their old gradients are dropped."""
    if params is None:
        assert model is not None
        params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    with kernels.predicting() if any(p.is_meta for p in params) else contextlib.nullcontext():
        _step(optimizer, params, accumulations, mode, watch)


def _step(optimizer: Any, params: list[Tensor], accumulations: int, mode: Any, watch: Any) -> None:
    mode = mode if mode is not None else contextlib.nullcontext()
    if watch is None:
        watch = contextlib.nullcontext()
    else:  # torch.compile does not trace under a dispatch mode: a compiled step (torchao's) runs eagerly
        watch = _eager_under(watch)
    own_backward = type(optimizer).backward is not ContractMixin.backward if hasattr(optimizer, "backward") else False
    if isinstance(optimizer, StepInBackward):  # the step runs in the backward's hooks
        with mode:
            loss = sum((p.float() * 1.0).sum() for p in params)
            with watch:
                Tensor.backward(loss)
                optimizer.step()
        return
    if own_backward or accumulations > 1 or any(p._backward_hooks for p in params):
        backward = optimizer.backward if own_backward else Tensor.backward
        for _ in range(accumulations):
            backward(sum((p.float() * 1.0).sum() for p in params))
    else:
        for p in params:
            p.grad = torch.ones_like(p)
    with mode, watch:
        optimizer.step()


class MetaModels:
    """``factory()`` on the meta device, built once per dtype (a 7B model takes
    seconds to build even without data) and handed out without gradients."""

    def __init__(self, factory: Callable[[], nn.Module]) -> None:
        self.factory = factory
        self.built: dict[torch.dtype | None, nn.Module] = {}

    def __call__(self, dtype: torch.dtype | None) -> nn.Module:
        if dtype not in self.built:
            self.built[dtype] = on_meta(self.factory, dtype)
        model = self.built[dtype]
        model.zero_grad(set_to_none=True)
        return model


def predict(optimizer_cfg: Any, factory: Callable[[], nn.Module] | MetaModels) -> dict[str, Any]:
    """The row of one config: bytes of optimizer state (master copies included,
    also alone), gradients and parameters, or the reason it cannot be predicted."""
    row: dict[str, Any] = {"built": built_name(optimizer_cfg), "status": "ok", "note": None,
                           "state_bytes": None, "master_bytes": None, "transient_bytes": None}  # fmt: skip
    models = factory if isinstance(factory, MetaModels) else MetaModels(factory)
    model = models(param_dtype(optimizer_cfg))
    params = [p for p in model.parameters() if p.requires_grad]
    row["n_params"] = sum(p.numel() for p in params)
    row["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    row["grad_bytes"] = sum(p.numel() * p.element_size() for p in params)
    reason = _unpredictable(optimizer_cfg)
    if reason:
        row["status"], row["note"] = "not predicted", reason
        return row
    error = None
    for in_kernels in (False, True):  # the aten-level fallback is slower: only when needed
        try:
            optimizer, fused = _build_on_meta(optimizer_cfg, model)
        except Exception as exc:  # noqa: BLE001 - shown in the row; the other configs still run
            row["status"], row["note"] = "failed", f"build: {exc}"
            return row
        try:
            with warnings.catch_warnings(), FusedKernels(fused):
                warnings.simplefilter("ignore")
                step_on(model, optimizer, _accumulations(optimizer_cfg), _meta_mode(in_kernels))
                row.update(optimizer_state_bytes(optimizer, params))
                watch = LiveStorages()
                step_on(model, optimizer, _accumulations(optimizer_cfg), _meta_mode(in_kernels), watch)
        except Exception as exc:  # noqa: BLE001 - the state cannot be initialised without data: say so
            error = exc
            model.zero_grad(set_to_none=True)
            continue
        row["transient_bytes"] = watch.peak
        _per_route(row, optimizer, params)
        return row
    row["status"], row["note"] = "not predicted", f"its step needs real data ({type(error).__name__}: {error})"
    return row


@contextlib.contextmanager
def _eager_under(watch: Any) -> Any:
    with torch.compiler.set_stance("force_eager"), watch:
        yield watch


def _build_on_meta(optimizer_cfg: Any, model: nn.Module) -> tuple[Any, bool]:
    """The optimizer as a real build makes it (torch's fused kernels where the
    class has them), or, where its constructor reads a fused state's value (a
    precision wrapper looking at Adagrad's ``step``), without them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with FusedKernels():
                return optcore.build_optimizer(optimizer_cfg, model), True
        except Exception:  # noqa: BLE001 - the second build reports its own error
            return optcore.build_optimizer(optimizer_cfg, model), False


def _meta_mode(in_kernels: bool) -> contextlib.ExitStack:
    """Answers for the ``.item()`` calls of a step on the meta device (see :class:`MetaScalars`)."""
    scalars = MetaScalars()
    mode = contextlib.ExitStack()
    mode.enter_context(scalars)
    if in_kernels:
        mode.enter_context(ItemsInKernels(scalars))
    return mode


def _per_route(row: dict[str, Any], optimizer: Any, params: list[Tensor]) -> None:
    """A composite's state by optimizer (Muon's one buffer, AdamW's two); with
    ``step_in_backward`` no gradient buffer: one parameter's gradient at a time."""
    inner = optimizer.inner if isinstance(optimizer, StepInBackward) else optimizer
    if isinstance(inner, CompositeOptimizer):
        seen: set[int] = set()  # storages, as optimizer_state_bytes counts them (GaLore's projector's too)
        row["state_by_optimizer"] = {
            label: _count(_tensors([inner.state.get(p, {}) for g in part.param_groups for p in g["params"]],
                                   objects=True), seen)
            for label, part in inner.parts.items()
        }
        row["note"] = "state by optimizer: " + ", ".join(f"{k} {v} B" for k, v in row["state_by_optimizer"].items())
    if isinstance(optimizer, StepInBackward):
        row["grad_bytes"] = max((p.numel() * p.element_size() for p in params), default=0)
        note = "step_in_backward: each gradient is freed as its parameter steps (the largest one shown)"
        row["note"] = f"{row['note']}; {note}" if row.get("note") else note


#: Why ``--params N`` cannot predict a composite: its routing is by shape.
COMPOSITE_NEEDS_SHAPES = (
    "a composite routes each parameter by its shape (matrices to Muon, the rest to its fallback), and --params N is "
    "one flat 1-D tensor with no matrix in it; give --model (your model's factory) or --hf-config (a transformers "
    "config.json, built on meta, no download) for the real shapes"
)


def predict_all(entries: Sequence[Mapping[str, Any]], factory: Callable[[], nn.Module], precision: str = "fp32",
                memory_efficient: bool = False, world_size: int = 1, sharding: str | None = None,
                shape_check: Callable[[], nn.Module] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One row per entry (see :func:`predict`), with totals, bytes per parameter
    and, with ``sharding`` over ``world_size`` ranks, what one rank holds (see
    :mod:`optcore.compare.memory_shard`)."""
    from .memory_shard import on_mesh, per_rank

    rows = []
    models = MetaModels(factory)
    twins = MetaModels(shape_check) if shape_check is not None else None
    for entry in entries:
        cfg = with_precision(entry["optimizer"], precision, memory_efficient)
        row = {"name": entry["name"], "config": cfg, **predict(cfg, models)}
        if twins is not None and "fallback" in typed_config(cfg):
            row.update(status="not predicted", state_bytes=None, master_bytes=None, transient_bytes=None,
                       note=COMPOSITE_NEEDS_SHAPES)
        elif row["status"] == "ok" and twins is not None:
            other = predict(cfg, twins)
            if other["state_bytes"] != row["state_bytes"]:
                row["note"] = ("its state depends on the parameter shapes: shown for one flat tensor (as a matrix: "
                               f"{other['state_bytes']} B); give --model or --hf-config for the real shapes")  # fmt: skip
        _totals(row)
        row["world_size"], row["sharding"] = world_size, sharding
        if sharding is not None and (row["status"] == "ok" or on_mesh(cfg, sharding)):
            per_rank(row, cfg, on_meta(factory, param_dtype(cfg)), sharding, world_size, _accumulations(cfg))
        rows.append(row)
    return rows


def _totals(row: dict[str, Any]) -> None:
    state = row["state_bytes"]
    row["total_bytes"] = None if state is None else state + row["grad_bytes"] + row["param_bytes"]
    n = row["n_params"] or 1
    row["total_bytes_per_param"] = None if state is None else row["total_bytes"] / n
