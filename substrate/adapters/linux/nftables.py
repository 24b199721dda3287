"""Loads nftables rulesets with the ``nft`` command (``nft -f -``, one transaction)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Final

import anyio

from substrate.errors import Internal, Unavailable
from substrate.net.nft_ruleset import check_table_name

NFT: Final = "nft"
_NOT_PERMITTED: Final = ("Operation not permitted", "Permission denied")
_MISSING: Final = "No such file or directory"


class Nftables:
    """Runs ``nft``; errors become ``Internal`` (with nft's text) or ``Unavailable``.

    ``Unavailable`` means nft is not installed or this process may not change the
    ruleset (it needs CAP_NET_ADMIN in the worker's network namespace).
    """

    def __init__(self, nft: str = NFT) -> None:
        self._nft = nft

    async def _run(self, args: Sequence[str], stdin: bytes | None) -> tuple[int, str, str]:
        try:
            done = await anyio.run_process(
                [self._nft, *args],
                input=stdin,
                check=False,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError:
            raise Unavailable(f"nftables' {self._nft!r} is not installed") from None
        except PermissionError as exc:
            raise Unavailable(f"cannot run {self._nft!r}: {exc}") from None
        return (
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace").strip(),
        )

    async def apply(self, ruleset: str) -> None:
        """Load ``ruleset`` with ``nft -f -``: all of it, or (on error) none of it."""
        code, _, err = await self._run(["-f", "-"], ruleset.encode())
        if code == 0:
            return
        if any(text in err for text in _NOT_PERMITTED):
            raise Unavailable(f"nft may not change the ruleset (needs CAP_NET_ADMIN): {err}")
        raise Internal(f"nft -f failed (exit {code}): {err}")

    async def list_table(self, table: str) -> str | None:
        """``nft list table ip <table>``'s text, or ``None`` if there is no such table."""
        check_table_name(table)
        code, out, err = await self._run(["list", "table", "ip", table], None)
        if code == 0:
            return out
        if _MISSING in err:
            return None
        if any(text in err for text in _NOT_PERMITTED):
            raise Unavailable(f"nft may not read the ruleset (needs CAP_NET_ADMIN): {err}")
        raise Internal(f"nft list table failed (exit {code}): {err}")


__all__ = ["NFT", "Nftables"]
