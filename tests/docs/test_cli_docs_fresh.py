"""docs/cli.md is generated from the CLI's parser; it must match the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_fresh() -> None:
    rendered = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_cli_docs.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert rendered == (ROOT / "docs" / "cli.md").read_text(), (
        "docs/cli.md is stale: run `make docs`"
    )


def test_every_command_is_documented() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    for command in ("ate up", "ate down", "ate call", "ate proxy", "ate top", "ate drain worker"):
        assert f"## `{command}`" in text, command
