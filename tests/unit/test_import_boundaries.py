"""The pure packages stay pure: no I/O libraries, no clock, no environment, no global RNG."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "substrate"
PURE = ("core", "sched", "snapshot", "sandbox", "net")
BANNED_MODULES = {
    "anyio",
    "asyncio",
    "asyncpg",
    "obstore",
    "pyroute2",
    "grpclib",
    "betterproto",
    "structlog",
    "socket",
    "subprocess",
    "threading",
    "trio",
    "zstandard",
    "substrate.services",
    "substrate.adapters",
    "substrate.api",
    "substrate.client",
}
# Calls that read the clock, the environment or hidden global randomness.
BANNED_ATTRS = {
    ("time", "time"),
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("time", "sleep"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("uuid", "uuid1"),
    ("uuid", "uuid4"),
    ("os", "environ"),
    ("os", "getenv"),
    ("os", "urandom"),
    ("random", "random"),
    ("random", "randint"),
    ("random", "randrange"),
    ("random", "choice"),
    ("random", "choices"),
    ("random", "sample"),
    ("random", "shuffle"),
    ("random", "uniform"),
    ("random", "seed"),
    ("secrets", "token_hex"),
}
BANNED_BUILTINS = {"open", "input", "print"}


def pure_files() -> list[Path]:
    files: list[Path] = []
    for pkg in PURE:
        files += sorted((ROOT / pkg).rglob("*.py"))
    return files


def _module_banned(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in BANNED_MODULES)


def violations(path: Path) -> list[str]:
    """What ``path`` does that pure code must not.

    Port modules (``*ports.py``) declare async protocols for the shell to implement, so
    ``async def`` is allowed there; nothing may ``await``.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    is_port = path.name.endswith("ports.py")
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if _module_banned(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _module_banned(node.module):
                found.append(f"from {node.module} import ...")
            for alias in node.names:
                if (node.module.rsplit(".", 1)[-1], alias.name) in BANNED_ATTRS:
                    found.append(f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in BANNED_ATTRS:
                found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            if (node.value.attr, node.attr) in BANNED_ATTRS:
                found.append(f"...{node.value.attr}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in BANNED_BUILTINS:
                found.append(f"{node.func.id}()")
        elif isinstance(node, ast.Await) or (
            isinstance(node, ast.AsyncFunctionDef | ast.AsyncFor | ast.AsyncWith) and not is_port
        ):
            found.append("async code")
    return found


@pytest.mark.parametrize("path", pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_has_no_io(path: Path) -> None:
    assert violations(path) == [], path


def test_the_checker_catches_violations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import anyio\nimport time\nfrom os import environ\nimport random\n"
        "x = time.monotonic()\ny = random.random()\nasync def f():\n    await g()\n"
    )
    got = "\n".join(violations(bad))
    for needle in ("import anyio", "time.monotonic", "random.random", "async code"):
        assert needle in got
