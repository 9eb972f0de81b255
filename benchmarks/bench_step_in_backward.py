"""Peak memory of a training step with ``"step_in_backward": true`` against the
ordinary loop, side by side in one run.

    python benchmarks/bench_step_in_backward.py                  # ~20M parameters, AdamW
    python benchmarks/bench_step_in_backward.py --size 5M --optimizer '{"type": "SGD", "lr": 0.1}'

Each side runs in a fresh process over the same MLP stack (a stack of
``Linear(d, d)`` layers, the shape of a transformer's matrices): the model and
the optimizer's state are built and one step taken, so the state exists; the
gradients are freed, the peak is reset and two more steps run. The figure is the peak above what
was resident before those steps (parameters, state and activations' reuse are
the same on both sides), so it is the gradients plus the step's temporaries.
On CUDA it is ``max_memory_allocated``; on CPU the process's peak resident set
(``VmHWM``, reset through ``/proc/self/clear_refs``), which counts the
allocator's pages, so it reads a little above the tensors' bytes.

Expected: the ordinary loop holds every gradient at the step, about 4 bytes per
fp32 parameter; step in backward holds one layer's at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json, sys, torch, optcore
cfg, n, width, device = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
layers = max(1, n // (width * width))
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width, bias=False), torch.nn.Tanh()) for _ in range(layers)]).to(device)
opt = optcore.build_optimizer(cfg, model)
x = torch.randn(8, width, device=device)
def step():
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
step()
opt.zero_grad(set_to_none=True)
gc.collect()
def resident():
    if device == "cuda":
        return torch.cuda.memory_allocated()
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
def reset():
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        open("/proc/self/clear_refs", "w").write("5")
def peak():
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
base = resident()
reset()
for _ in range(2):
    step()
params = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"params_bytes": params, "base": base, "peak_above_base": peak() - base, "layers": layers}))
"""


def parse_size(text: str) -> int:
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale != 1 else text) * scale)


def run(config: dict, size: int, width: int, device: str) -> dict:
    # a fixed mmap threshold: glibc returns each freed tensor's pages at once, so the resident set follows the tensors
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(config), str(size), str(width), device],
        check=True, capture_output=True, text=True, env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="20M", help="parameters (default 20M)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--optimizer", default='{"type": "AdamW", "lr": 1e-3}', help="optimizer config (JSON)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    config = json.loads(args.optimizer)
    size = parse_size(args.size)
    ordinary = run(config, size, args.width, args.device)
    in_backward = run({**config, "step_in_backward": True}, size, args.width, args.device)
    mib = 1 << 20
    grads = ordinary["params_bytes"]
    print(f"model: {ordinary['layers']} x Linear({args.width}, {args.width}), {grads / mib:.1f} MiB of parameters "
          f"(so {grads / mib:.1f} MiB of gradients); {config} on {args.device}")
    print(f"{'loop':<20} {'peak above resident (MiB)':>26}")
    print(f"{'ordinary':<20} {ordinary['peak_above_base'] / mib:>26.1f}")
    print(f"{'step_in_backward':<20} {in_backward['peak_above_base'] / mib:>26.1f}")
    saved = ordinary["peak_above_base"] - in_backward["peak_above_base"]
    ratio = in_backward["peak_above_base"] / max(ordinary["peak_above_base"], 1)
    print(f"step_in_backward / ordinary: {ratio:.2f}; saved {saved / mib:.1f} MiB = {saved / grads:.2f} x the gradients")
    return {"ordinary": ordinary, "step_in_backward": in_backward, "ratio": ratio, "saved_over_gradients": saved / grads}


if __name__ == "__main__":
    main()
