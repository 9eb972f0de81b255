"""Each extra alone: a clean venv with the core and one extra runs that extra's commands.

The test extras install everything at once, which hid a dependency ``[compare]`` lacked
(scipy, for Optuna's QMC sampler). Here each venv gets only the torch CPU wheel
(scripts/dev's pin), the core and one extra, as a user's ``pip install "optcore[X]"``
would, and runs that extra's commands from a folder outside the clone. A command of an
extra that is not installed says in one line which extra to install: no traceback.

Each venv takes about a minute (pip's cache makes later ones quicker); the cases spread
over pytest-xdist's workers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH = re.search(r"^TORCH_VERSION=(\S+)", (ROOT / "scripts" / "dev").read_text(), re.MULTILINE).group(1)

HF_SCRIPT = """
import torch, transformers
from optcore.integrations import hf
config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2)
model = transformers.LlamaForCausalLM(config)
optimizer, scheduler = hf.optimizers({"type": "AdamW", "lr": 1e-3}, model)
ids = torch.randint(0, 64, (2, 8))
model(input_ids=ids, labels=ids).loss.backward()
optimizer.step()
print("hf ok", type(optimizer).__name__)
"""

DEEPSPEED_SCRIPT = """
import os
os.environ.update(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
import deepspeed.ops
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # training uses gloo's collectives
import torch
from optcore.integrations import deepspeed as ds
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1},
          "optimizer": {"type": "optcore", "params": {"type": "AdamW", "lr": 1e-3}}}
engine, optimizer, _, _ = ds.initialize(model, config)
loss = engine(torch.randn(4, 4)).square().mean()
engine.backward(loss)
engine.step()
print("deepspeed ok")
"""

#: extra -> the commands it runs (argv lists; "python" is the venv's interpreter) and what each prints
CASES: dict[str, list[tuple[list[str], int, str]]] = {
    "": [
        (["python", "QUICKSTART"], 0, "resumed with lr"),
        (["optcore", "list"], 0, "AdamW"),
        (["optcore", "show", "AdamW"], 0, "lr"),
        (["optcore", "check", "RUN_JSON"], 0, ""),
        (["optcore", "compare", "--steps", "5"], 1, "pip install 'optcore[compare]'"),
        (["optcore", "check", "RUN_YAML"], 1, "pip install 'optcore[yaml]'"),
    ],
    "yaml": [(["optcore", "check", "RUN_YAML"], 0, "")],
    "cli": [(["optcore", "check", "RUN_YAML"], 0, ""), (["optcore", "list"], 0, "AdamW")],
    "compare": [
        (["optcore", "compare", "--optimizers", "AdamW,SGD", "--trials", "3", "--studies", "1", "--steps", "30",
          "--out", "OUT"], 0, "AdamW"),
        (["optcore", "memory", "--params", "1M", "--optimizers", "AdamW,SGD"], 0, "AdamW"),
    ],
    "hf": [(["python", "-c", HF_SCRIPT], 0, "hf ok")],
    "deepspeed": [(["python", "-c", DEEPSPEED_SCRIPT], 0, "deepspeed ok")],
}


def _venv(where: Path, extra: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    links = [a for d in ("/opt/wheels", os.environ.get("OPTCORE_WHEELS", "")) if d and os.path.isdir(d)
             for a in ("--find-links", d)]  # fmt: skip
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *links]
    # a copy of the source of its own: setuptools builds in the source folder (build/), and the
    # cases run at once on xdist's workers
    source = where.parent / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "site", "__pycache__", "*.egg-info", ".hypothesis", ".pytest_cache"))
    target = f"{source}[{extra}]" if extra else str(source)
    for packages in ([f"torch=={TORCH}"], [target, f"torch=={TORCH}"]):
        done = subprocess.run([*pip, *packages], capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, f"pip install {packages} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return where / "bin"


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize("extra", list(CASES), ids=lambda e: e or "core")
def test_each_extra_alone_runs_its_commands(extra, tmp_path):
    bin_dir = _venv(tmp_path / "venv", extra)
    work = tmp_path / "work"  # outside the clone: the venv's optcore, not the clone's folder
    work.mkdir()
    (work / "run.json").write_text('{"optimizer": {"type": "AdamW", "lr": 0.001}, "num_training_steps": 10}')
    (work / "run.yaml").write_text("optimizer:\n  type: AdamW\n  lr: 1.0e-3\nnum_training_steps: 10\n")
    names = {"QUICKSTART": str(ROOT / "examples" / "quickstart.py"), "RUN_JSON": str(work / "run.json"),
             "RUN_YAML": str(work / "run.yaml"), "OUT": str(work / "out")}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "OPTCORE_"))}
    env.update(PORT=_free_port(), MPLBACKEND="Agg")
    for argv, rc, expected in CASES[extra]:
        argv = [str(bin_dir / argv[0]), *(names.get(a, a) for a in argv[1:])]
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900, check=False)
        command = " ".join([argv[0], *(a[:40] for a in argv[1:])])
        shown = f"{command}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        assert done.returncode == rc, shown
        assert "Traceback" not in done.stderr, shown
        assert expected in done.stdout + done.stderr, shown
        if rc and argv[1] == "compare":  # an application without its extra: one line
            assert len(done.stderr.strip().splitlines()) == 1, shown
