"""Render docs/cli.md, the `ate` CLI reference, from the CLI's own argparse parser.

Usage: python scripts/render_cli_docs.py > docs/cli.md
(`make docs` does this; tests/docs/test_cli_docs_fresh.py fails when docs/cli.md is stale.)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from substrate.cli.main import build_parser

HEADER = """# `ate` CLI reference

Generated from the CLI's parser by `scripts/render_cli_docs.py` (`make docs`); do not edit.
Every command takes `--state-dir DIR` (default: `$ATE_STATE_DIR`, then
`$XDG_STATE_HOME/ate`, then `~/.local/state/ate`). Errors print one line,
`error: <STATUS_CODE>: <description>`, and exit 1; usage errors exit 2.
"""


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    children = list(_subparsers(parser))
    if path and not children:
        yield path, parser
    for name, child in children:
        yield from walk(child, (*path, name))


def render() -> str:
    os.environ["COLUMNS"] = "100"  # stable wrapping of the help text
    parser = build_parser()
    parser.prog = "ate"
    out = [HEADER]
    for path, sub in walk(parser):
        sub.prog = "ate " + " ".join(path)
        out.append(f"\n## `ate {' '.join(path)}`\n\n")
        out.append("```text\n" + sub.format_help().rstrip() + "\n```\n")
    return "".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
