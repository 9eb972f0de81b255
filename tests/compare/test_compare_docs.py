"""docs/choosing.md: its pictures exist, and its commands parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from optcore.cli import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = (DOCS / "choosing.md").read_text()


def test_the_page_references_images_that_exist():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", PAGE)
    assert len(images) >= 3
    for image in images:
        path = DOCS / image
        assert path.is_file(), f"{image} is missing: run the commands under 'Regenerating the pictures'"
        assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size < 400_000


def test_the_commands_on_the_page_parse():
    blocks = re.findall(r"```bash\n(.*?)```", PAGE, flags=re.S)
    commands = [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert any(c.startswith("optcore memory") for c in commands) and any("--lr-sweep" in c for c in commands)
    parser = build_parser()
    for command in commands:
        words = shlex.split(command.split("#")[0])
        assert words[0] == "optcore", command
        parser.parse_args(words[1:])


def test_the_regenerating_commands_write_the_pictures():
    regenerate = PAGE[PAGE.index("## Regenerating the pictures") :]
    for image in re.findall(r"!\[[^\]]*\]\(img/([^)]+)\)", PAGE):
        folder = str(Path("docs/img") / Path(image).parent)
        assert f"--out {folder}" in regenerate, image


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header, which must be a whole PNG's: signature, IHDR first, IEND last."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    assert data[-8:-4] == b"IEND", f"{path} is cut short"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_the_dashboard_screenshots_are_referenced_exist_and_say_how_they_were_taken():
    """optuna-dashboard's pages of a compare study: browser screenshots made by a documented
    command (scripts/dashboard_screenshot.py), real PNGs of a browser window's size, small."""
    section = PAGE[PAGE.index("### Reading a study in optuna-dashboard") : PAGE.index("### Keeping it affordable")]
    images = re.findall(r"!\[[^\]]*\]\((img/choosing/dashboard-[a-z]+\.png)\)", section)
    assert images == ["img/choosing/dashboard-study.png", "img/choosing/dashboard-trial.png"]
    script = DOCS.parent / "scripts" / "dashboard_screenshot.py"
    assert script.is_file()
    for image in images:
        path = DOCS / image
        assert path.is_file(), f"{image} is missing: run `python scripts/dashboard_screenshot.py`"
        assert 10_000 < path.stat().st_size < 300_000, image
        width, height = _png_size(path)
        assert width == 1400 and 900 <= height <= 3000, (image, width, height)
        assert Path(image).name in script.read_text()
    # the command, the browser and the date it was taken on
    assert "python scripts/dashboard_screenshot.py --out docs/img/choosing" in section
    assert re.search(r"Chromium \d+", section) and re.search(r"taken on \d{4}-\d{2}-\d{2}", section)
    regenerate = PAGE[PAGE.index("## Regenerating the pictures") :]
    assert "python scripts/dashboard_screenshot.py --out docs/img/choosing" in regenerate
    # the dashboard opens the storage of the compare command the section shows
    (compare,) = [c for c in re.findall(r"^optcore compare .*$", section, flags=re.M)]
    out = shlex.split(compare)[shlex.split(compare).index("--out") + 1]
    assert f"optuna-dashboard sqlite:///{out}/optuna.db" in section
