"""The task protocol of ``optcore compare --task``, and where tasks come from.

A task is any object with these members (a class or a function returning one
is called with no arguments first)::

    name: str                                   # a short label ("char-lm")
    def describe(self) -> str                   # one line for titles: model, data, batch
    def model(self) -> torch.nn.Module          # a fresh model; called after torch.manual_seed(seed),
                                                # so every config starts from the same weights
    def batches(self, seed: int) -> Iterator    # endless training batches, the same for a seed
    def heldout(self, seed: int) -> Sequence    # fixed held-out batches
    def loss(self, model, batch) -> Tensor      # mean loss of a batch, a float32 scalar

Optional: ``loss_label`` (the plot's y axis, e.g. ``"cross-entropy (nats/char)"``)
and ``sample(model, n, seed, device) -> str`` (``optcore train --sample``).
Batches are CPU tensors (or tuples, lists, dicts of them); the runner moves
them to the device. The held-out loss is the mean of ``loss`` over
``heldout(seed)`` with the model in eval mode, without gradients.

``--task`` takes a built-in name (:data:`BUILTIN`), ``package.module:name`` or
``path/to/file.py:name``. See ``examples/my_task.py``. A ``package.module`` that no
folder on ``sys.path`` holds is looked for in the current folder too, as
``python -m`` finds one: the ``optcore`` script's ``sys.path`` starts with its own
``bin`` folder, not with the folder it runs in.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from optcore import ConfigError

from ..._import_paths import import_paths_allowed
from ..._values import short_repr

#: Built-in tasks: none needs a download.
BUILTIN = {
    "char-lm": "optcore.compare.tasks.char_lm:CharLMTask",
    "hf-llama": "optcore.compare.tasks.hf_lm:HFLlamaTask",
    "vision": "optcore.compare.tasks.vision:VisionTask",
}
DEFAULT_TASK = "char-lm"
REQUIRED = ("name", "describe", "model", "batches", "heldout", "loss")


def load_task(spec: str | None = None) -> Any:
    """The task named by ``spec`` (see the module docstring), checked against the protocol."""
    spec = spec or DEFAULT_TASK
    target = BUILTIN.get(spec, spec)
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"--task {spec!r} is neither a built-in task ({', '.join(BUILTIN)}) nor 'package.module:name' "
            "or 'path/to/file.py:name'.",
            problems=[("task", "bad spec")],
            accepted=list(BUILTIN),
        )
    if spec not in BUILTIN and not import_paths_allowed():
        raise ConfigError(
            f"--task {short_repr(spec, 200)} names user code (a module path or a file), and import paths are turned "
            "off (OPTCORE_ALLOW_IMPORT_PATHS=0), so no module is imported for a task either. Use a built-in task "
            f"({', '.join(BUILTIN)}), or unset OPTCORE_ALLOW_IMPORT_PATHS where you trust that code.",
            problems=[("task", "import paths are turned off")],
            accepted=list(BUILTIN),
        )
    obj = getattr(_import(module_name, spec), attr, None)
    if obj is None:
        raise ConfigError(f"--task {spec!r}: {module_name} has no {attr!r}.", problems=[("task", "missing name")])
    task = obj() if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "batches")) else obj
    missing = [m for m in REQUIRED if not hasattr(task, m)]
    if missing:
        raise ConfigError(
            f"--task {spec!r} is not a task: it lacks {', '.join(missing)}. A task has "
            f"{', '.join(REQUIRED)} (see `optcore.compare.tasks`).",
            problems=[(m, "missing") for m in missing],
        )
    return task


def _import(module_name: str, spec: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        if not path.is_file():
            raise ConfigError(f"--task {spec!r}: no file {str(path)!r}.", problems=[("task", "no file")])
        name = f"optcore_task_{abs(hash(str(path)))}"
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module
    try:
        with _current_folder_for(module_name.partition(".")[0]):
            return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"--task {spec!r}: cannot import {module_name!r} ({exc}), neither from the installed packages nor "
            f"from the current folder {os.getcwd()!r}. Run from the folder that holds it, install what it needs, "
            "or give 'path/to/file.py:name'.",
            problems=[("task", "import failed")],
        ) from None


@contextlib.contextmanager
def _current_folder_for(top: str) -> Iterator[None]:
    """The current folder at the end of ``sys.path`` while a ``--task`` (or
    ``--model``) module the user named is imported, when no folder on
    ``sys.path`` holds its top-level package ``top``.

    ``python -m`` puts the current folder on ``sys.path``; the ``optcore``
    script does not, so ``--task nctask.tasks:task`` run beside ``nctask/``
    would not find it. At the end, the folder never shadows an installed
    module, and only for this import: it is the user's own command line that
    names the module (a stored spec reaches here only when the worker's own
    ``--task`` names the same text, optcore/compare/trust.py), while a type
    read from storage or a config file is resolved with ``sys.path`` as it was.
    The package's own submodules are found through its ``__path__`` later too.
    """
    here = os.getcwd()
    try:
        found = top in sys.modules or importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # not a name a finder accepts: the import says so
        found = True
    if found or here in sys.path:
        yield
        return
    sys.path.append(here)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(here)


def to_device(batch: Any, device: Any) -> Any:
    """``batch`` with every tensor in it moved to ``device``."""
    if hasattr(batch, "to") and callable(batch.to):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
