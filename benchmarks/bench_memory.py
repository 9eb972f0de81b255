"""``optcore memory`` on a 7B Llama-shaped transformers config: wall time of the
whole command (interpreter start, imports, building the model on the meta device,
every optimizer of the compare line-up built and stepped once), target < 10 s on
2 CPU cores.

    python benchmarks/bench_memory.py            # the default line-up, 7B Llama config
    python benchmarks/bench_memory.py --repeat 3

It writes the config to a temporary folder (nothing is downloaded) and runs
``optcore memory --hf-config ... --json`` in a fresh process, timing it from the
outside; it prints the phases measured inside (imports, model, each optimizer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
}  # fmt: skip

PHASES = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
from optcore.compare import lineup, memory
t1 = time.perf_counter()
models = memory.MetaModels(memory.factory_from_hf_config(sys.argv[1]))
models(None)
t2 = time.perf_counter()
print(f"imports {t1 - t0:.2f} s, model on meta {t2 - t1:.2f} s")
for entry in lineup.default_entries():
    t = time.perf_counter()
    row = memory.predict(entry["optimizer"], models)
    print(f"  {entry['name']:<20} {time.perf_counter() - t:5.2f} s  {row['status']}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(LLAMA_7B))
        command = [sys.executable, "-m", "optcore.cli", "memory", "--hf-config", str(config), "--json"]
        walls = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            walls.append(time.perf_counter() - start)
        rows = json.loads(out)["rows"]
        print(f"optcore memory, 7B Llama config ({rows[0]['n_params'] / 1e9:.2f}B params), {len(rows)} configs: "
              f"best {min(walls):.1f} s of {len(walls)} (target < 10 s on 2 cores)")  # fmt: skip
        for r in rows:
            print(f"  {r['name']:<20} {r['status']:<14} {(r['total_bytes'] or 0) / 2**30:8.1f} GiB total")
        print("phases (one process):")
        print(subprocess.run([sys.executable, "-c", PHASES, str(config)], capture_output=True, text=True,
                             check=True).stdout, end="")  # fmt: skip


if __name__ == "__main__":
    main()
