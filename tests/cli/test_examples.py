"""The examples that run without a stack: the in-process custom control plane."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import structlog

ROOT = Path(__file__).resolve().parents[2]


def test_custom_control_plane_runs(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(
        "custom_control_plane", ROOT / "examples" / "custom_control_plane.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    saved = structlog.get_config()  # the example quiets structlog; put it back after
    try:
        assert module.main(["--workers", "4", "--actors", "6"]) == 0
    finally:
        structlog.configure(**saved)
    out = capsys.readouterr().out
    assert "placements:" in out
    assert "lab/a0: suspended and resumed from local (generation 1): count=3" in out
    assert "lab/clone: started from tag lab/gold (tag)" in out
