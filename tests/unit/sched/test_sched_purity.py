"""The scheduler package stays pure: no I/O libraries, clock, environment or global random."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import substrate.sched

PACKAGE_DIR = Path(substrate.sched.__file__).parent
SOURCES = sorted(PACKAGE_DIR.glob("*.py"))
BANNED_MODULES = {
    "anyio",
    "asyncio",
    "asyncpg",
    "obstore",
    "pyroute2",
    "grpclib",
    "betterproto",
    "structlog",
    "time",
    "datetime",
    "os",
    "secrets",
    "uuid",
    "trio",
}
MUTABLE_NODES = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def test_sources_found() -> None:
    names = {p.name for p in SOURCES}
    assert {"__init__.py", "constraints.py", "load.py", "p2c.py", "booking.py", "index.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_banned_imports_and_no_global_random(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] not in BANNED_MODULES, alias.name
        elif isinstance(node, ast.ImportFrom):
            root = (node.module or "").split(".")[0]
            assert root not in BANNED_MODULES, node.module
            if root == "random":
                assert [a.name for a in node.names] == ["Random"]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
        ):
            # Only the type is used (as an annotation); never random.random() and friends.
            assert node.attr == "Random", f"{path.name}:{node.lineno} uses random.{node.attr}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_module_level_mutable_state(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names == ["__all__"]:
                continue
            assert not isinstance(node.value, MUTABLE_NODES), f"{path.name}: {names}"
            if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
                assert node.value.func.id not in {"list", "dict", "set", "bytearray"}, names


def test_public_api_is_curated() -> None:
    exported = set(substrate.sched.__all__)
    assert {
        "Constraints",
        "FleetIndex",
        "applies",
        "book",
        "choose",
        "has_room",
        "release",
        "schedule",
    } <= exported
    for name in exported:
        assert hasattr(substrate.sched, name), name
    for module in ("booking", "constraints", "index", "load", "p2c", "scheduler"):
        mod = importlib.import_module(f"substrate.sched.{module}")
        for name in mod.__all__:
            assert hasattr(mod, name)
