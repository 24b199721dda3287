"""The generated code in substrate/api/_gen matches what proto/ generates today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN_DIR = ROOT / "substrate" / "api" / "_gen"
SCRIPT = ROOT / "scripts" / "gen_proto.py"
HINT = "substrate/api/_gen is stale: run `make gen-proto` and commit the result"


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by relative path, without interpreter caches."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.mark.slow
def test_generated_code_is_fresh(tmp_path: Path) -> None:
    out = tmp_path / "_gen"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (
        f"scripts/gen_proto.py failed (are the dev extras installed?):\n"
        f"{result.stdout}{result.stderr}"
    )
    fresh, committed = _tree(out), _tree(GEN_DIR)
    missing = sorted(fresh.keys() - committed.keys())
    extra = sorted(committed.keys() - fresh.keys())
    changed = sorted(k for k in fresh.keys() & committed.keys() if fresh[k] != committed[k])
    problems = {"missing": missing, "not generated any more": extra, "changed": changed}
    stale = {what: files for what, files in problems.items() if files}
    assert not stale, f"{HINT}: {stale}"


def test_generated_package_imports() -> None:
    from substrate.api._gen.substrate import v1

    assert v1.ControlStub.__name__ == "ControlStub"
    assert (GEN_DIR / "proto" / "substrate" / "v1" / "types.proto").is_file()
