"""The screenshots in docs/choosing.md of a compare study in optuna-dashboard, taken from a real browser.

It runs a small comparison into an Optuna storage (SQLite in a temporary folder),
serves it with optuna-dashboard on 127.0.0.1 (a free port), opens two of the
study's pages in headless Chromium (the study: its history under the objective's
name, the params' importance, the best trial and every trial's learning curve;
the best trial: its value, learning curve, params and user attributes) and
writes them, reduced to palette PNGs, to docs/img/choosing/dashboard-study.png
and dashboard-trial.png. The server is stopped however it ends.

Needs optcore[test] (optuna-dashboard, Pillow through matplotlib) and Chromium
(Debian: ``apt-get install -y chromium``), run from the repository root:

    .venv/bin/python scripts/dashboard_screenshot.py [--out docs/img/choosing]

``--keep DIR`` keeps the comparison's folder (``optuna.db``, results.json) in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "img" / "choosing"
#: (file, page of the study, browser window): ``{best}`` is the best trial's number.
PAGES = (("dashboard-study.png", "", "1400,2600"), ("dashboard-trial.png", "trials?numbers={best}", "1400,1000"))
#: The comparison the picture shows: three optimizers, each at three lrs around its own, one seed.
COMPARE = ["compare", "--optimizers", "AdamW,optcore-lion:Lion,torch:SGD", "--lr-sweep", "3", "--seeds", "1",
           "--steps", "100", "--in-process", "--quiet"]  # fmt: skip
#: Chromium's flags for a headless run as root without a display, a profile or any network of its own.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]  # fmt: skip
#: Chromium runs the page's scripts this long (virtual time) before the picture: the app fetches and draws.
RENDER_MS = 15_000
#: The largest picture the docs take.
MAX_BYTES = 300_000


def build_study(folder: Path) -> str:
    """Run :data:`COMPARE` into ``folder``; the storage URL of its ``optuna.db``."""
    from optcore.cli import main

    if main([*COMPARE, "--out", str(folder)]) != 0:
        raise SystemExit("the comparison failed; see above")
    return f"sqlite:///{(folder / 'optuna.db').resolve()}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.loads(response.read())


def serve(url: str, port: int, log: Path) -> subprocess.Popen:
    """optuna-dashboard serving ``url`` on 127.0.0.1:``port``, once it answers its API."""
    script = Path(sys.executable).with_name("optuna-dashboard")
    command = [str(script)] if script.exists() else [shutil.which("optuna-dashboard") or "optuna-dashboard"]
    server = subprocess.Popen([*command, url, "--host", "127.0.0.1", "--port", str(port), "--server", "wsgiref"],
                              stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 90
    while True:
        try:
            _get(port, "/api/studies")
            return server
        except (urllib.error.URLError, OSError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit(f"optuna-dashboard did not start:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.3)


def screenshot(chromium: str, page: str, png: Path, size: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                        f"--virtual-time-budget={RENDER_MS}", f"--screenshot={png}", page],
                       check=True, capture_output=True, timeout=120)  # fmt: skip


def shrink(raw: Path, out: Path) -> None:
    """``raw`` as a 64-colour palette PNG at ``out`` (a screenshot of a web page has few colours)."""
    from PIL import Image

    with Image.open(raw) as image:
        image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    if out.stat().st_size > MAX_BYTES:
        raise SystemExit(f"{out} is {out.stat().st_size:,} B, over {MAX_BYTES:,}: take a smaller window (PAGES)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="the folder of the two PNGs")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--keep", type=Path, help="keep the comparison's folder here")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / "compare"
        url = build_study(folder)
        port = _free_port()
        server = serve(url, port, Path(tmp) / "dashboard.log")
        shots = []
        try:
            studies = {s["study_name"]: s["study_id"] for s in _get(port, "/api/studies")["study_summaries"]}
            study = studies["compare"]
            (best,) = _get(port, f"/api/studies/{study}")["best_trials"]
            for name, page, size in PAGES:
                raw = Path(tmp) / name
                screenshot(args.chromium, f"http://127.0.0.1:{port}/dashboard/studies/{study}/"
                           + page.format(best=best["number"]), raw, size)  # fmt: skip
                shots.append((raw, args.out / name))
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        args.out.mkdir(parents=True, exist_ok=True)
        for raw, out in shots:
            shrink(raw, out)
            print(f"Wrote {out} ({out.stat().st_size:,} B)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
