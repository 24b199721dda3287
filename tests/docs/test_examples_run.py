"""examples/embed_scheduler.py runs, and docs/embedding.md quotes it faithfully."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/embed_scheduler.py"
GUIDE = ROOT / "docs/embedding.md"


def _blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced code blocks whose info string is ``language``."""
    blocks: list[str] = []
    info: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if info is None and line.startswith("```"):
            info, body = line[3:].strip(), []
        elif info is not None and line.strip() == "```":
            if info == language:
                blocks.append("\n".join(body) + "\n")
            info = None
        elif info is not None:
            body.append(line)
    return blocks


@pytest.mark.slow
def test_embed_scheduler_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for part in ("1. scheduler", "2. control plane", "3. property", "4. simulator"):
        assert any(line.startswith(part) for line in lines), (part, done.stdout)
    assert "no worker has room" in done.stdout
    assert "resumed from LOCAL generation 1 (60 s old): counter 3 -> 4" in done.stdout
    # The guide shows the output of this very run (it is deterministic).
    (shown,) = _blocks(GUIDE.read_text(encoding="utf-8"), "")
    assert shown.splitlines() == lines


def test_every_snippet_of_the_guide_is_an_excerpt_of_the_example() -> None:
    example = [line.rstrip() for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]
    snippets = _blocks(GUIDE.read_text(encoding="utf-8"), "python")
    assert len(snippets) >= 5
    for snippet in snippets:
        wanted = [line.rstrip() for line in snippet.splitlines()]
        found = any(
            example[i : i + len(wanted)] == wanted for i in range(len(example) - len(wanted) + 1)
        )
        assert found, f"docs/embedding.md quotes code that is not in the example:\n{snippet}"
