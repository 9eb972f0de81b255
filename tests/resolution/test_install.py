"""How optcore is installed: a folder named ``optcore`` beside a script (a clone
of this repository) must not shadow the installed package."""

from __future__ import annotations

import subprocess
import sys


def test_a_clone_folder_beside_a_script_does_not_shadow_the_package(tmp_path):
    (tmp_path / "optcore" / "plugins").mkdir(parents=True)  # the shape of a clone: no __init__.py at its root
    script = tmp_path / "train.py"
    script.write_text("import optcore\nprint(optcore.build_optimizer.__module__)\n")
    env_free = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env_free)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "optcore._build"
