"""``Nftables``: loading rulesets with ``nft -f -`` and the errors it gives."""

from __future__ import annotations

import secrets
import subprocess
import sys

import anyio
import pytest

from substrate.adapters.linux.nftables import Nftables
from substrate.errors import Internal, InvalidArgument, Unavailable
from substrate.net.nft_ruleset import render_delete_table, render_egress_table
from tests.privileges import needs_nft

pytestmark = pytest.mark.anyio


@pytest.fixture
def table() -> str:
    return f"tnft_{secrets.token_hex(3)}"


@needs_nft
async def test_rendered_tables_load_replace_and_delete(table: str) -> None:
    nft = Nftables()
    try:
        prefix = "tnq" + table[-4:]
        await nft.apply(render_egress_table(table, prefix, "169.254.17.1", {}))
        assert await nft.list_table(table) is not None
        ports = {prefix + "a": 40001, prefix + "b": 40002}
        await nft.apply(render_egress_table(table, prefix, "169.254.17.1", ports))
        listed = await nft.list_table(table)
        assert listed is not None
        assert f'redirect to :iifname map {{ "{prefix}a" : 40001, "{prefix}b" : 40002 }}' in listed
        assert f'"{prefix}a" . 169.254.17.1 . 40001' in listed
        await nft.apply(render_delete_table(table))
        assert await nft.list_table(table) is None
        await nft.apply(render_delete_table(table))  # not there: still fine
    finally:
        await anyio.run_process(["nft", "delete", "table", "ip", table], check=False)


@needs_nft
async def test_a_bad_ruleset_is_internal_with_nfts_text_and_changes_nothing(table: str) -> None:
    nft = Nftables()
    try:
        await nft.apply(render_egress_table(table, "tnq", "169.254.17.1", {}))
        before = await nft.list_table(table)
        with pytest.raises(Internal, match="syntax error") as caught:
            await nft.apply(
                f"delete table ip {table}\ntable ip {table} {{ chain c {{ bogus }} }}\n"
            )
        assert "nft -f failed" in caught.value.description
        assert await nft.list_table(table) == before, "the transaction must be all or nothing"
    finally:
        await anyio.run_process(["nft", "delete", "table", "ip", table], check=False)


async def test_a_missing_nft_is_unavailable() -> None:
    with pytest.raises(Unavailable, match="not installed"):
        await Nftables(nft="/nonexistent/nft").apply("")


async def test_list_table_checks_the_name() -> None:
    with pytest.raises(InvalidArgument):
        await Nftables().list_table("x; flush ruleset")


@needs_nft
def test_without_privileges_it_is_unavailable(table: str) -> None:
    script = (
        "import anyio\n"
        "from substrate.adapters.linux.nftables import Nftables\n"
        "from substrate.net.nft_ruleset import render_egress_table\n"
        "from substrate.errors import Unavailable\n"
        "async def main():\n"
        "    try:\n"
        f"        text = render_egress_table({table!r}, 'tnq', '169.254.17.1', {{}})\n"
        "        await Nftables().apply(text)\n"
        "    except Unavailable as exc:\n"
        "        print('Unavailable', exc.description)\n"
        "anyio.run(main)\n"
    )
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.stdout.startswith("Unavailable"), done.stdout + done.stderr
    assert "CAP_NET_ADMIN" in done.stdout
