"""Byte sizes on the command line (``512Mi``, ``8G``, ``1073741824``)."""

from __future__ import annotations

import argparse

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: str) -> int:
    """``512Mi``, ``8G``, ``1073741824`` → bytes (binary units; ``i`` and ``B`` optional)."""
    text = value.strip().lower().removesuffix("b").removesuffix("i")
    digits = text.rstrip("kmgt")
    unit = text[len(digits) :]
    if not digits.isdigit() or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"bad size {value!r}: want e.g. 512Mi or 8Gi")
    return int(digits) * _SIZE_UNITS[unit]


__all__ = ["parse_size"]
