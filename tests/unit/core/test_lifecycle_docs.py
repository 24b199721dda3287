"""docs/lifecycle.md is rendered from the table and must not go stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_rendered_diagram_is_fresh() -> None:
    spec = importlib.util.spec_from_file_location("render", ROOT / "scripts/render_lifecycle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = module.render()
    actual = (ROOT / "docs/lifecycle.md").read_text()
    assert actual == expected, "docs/lifecycle.md is stale: run `make docs`"
