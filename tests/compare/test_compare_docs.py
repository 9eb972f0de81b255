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
