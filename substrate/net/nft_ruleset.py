"""The nftables text of one worker's egress table (pure).

Every actor's sandbox reaches the outside only through its veth, and nothing it sends
is routed anywhere: the table, loaded in the *worker's* network namespace (rules inside
the actor's namespace never see gVisor's netstack traffic), keys everything on the
host-side veth name:

* ``prerouting`` (nat): every new TCP connection arriving on a veth listed in ``ports``
  is redirected to that actor's own egress listener (``redirect to :`` the port the
  veth maps to, on the veth's address — the gateway). ``SO_ORIGINAL_DST`` on the
  accepted socket gives the address the actor asked for.
* ``input`` (filter): from the worker's veths the host accepts only packets of
  connections it already has (replies to connections it opened, and the rest of
  redirected connections), ICMP, and new connections to the gateway at the actor's own
  egress port; everything else from them (UDP and DNS included, and TCP from veths that
  have no port) is dropped.
* ``forward`` (filter): nothing is forwarded from or to the worker's veths.

:func:`render_egress_table` replaces the table in one ``nft -f`` transaction that works
whether or not the table exists (``table ip X {}`` adds it if missing, ``delete table``
then removes it, and the new table is added): a reload never leaves a moment without
rules. :func:`render_delete_table` removes it, again tolerating a missing table.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Final

from substrate.errors import InvalidArgument

IFNAME_MAX: Final = 15
"""The kernel's limit on interface names (IFNAMSIZ - 1)."""
TABLE_NAME_MAX: Final = 64

_TABLE_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_IFNAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_table_name(table: str) -> str:
    """``table`` if it is a plain nftables identifier (letters, digits, ``_``)."""
    if (
        not isinstance(table, str)
        or len(table) > TABLE_NAME_MAX
        or _TABLE_RE.fullmatch(table) is None
    ):
        raise InvalidArgument(
            f"nftables table name {table!r} must be a letter followed by letters, digits "
            f"or '_', at most {TABLE_NAME_MAX} characters"
        )
    return table


def check_ifname(name: str, *, what: str = "interface name", max_len: int = IFNAME_MAX) -> str:
    """``name`` if it is a safe interface name (or prefix) of at most ``max_len`` chars."""
    if not isinstance(name, str) or not name or len(name) > max_len:
        raise InvalidArgument(f"{what} {name!r} must have 1 to {max_len} characters")
    if _IFNAME_RE.fullmatch(name) is None:
        raise InvalidArgument(
            f"{what} {name!r} may only contain letters, digits, '_', '.' and '-' "
            "and must start with a letter or digit"
        )
    return name


def _check_port(veth: str, port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgument(f"egress port of {veth!r} must be 1..65535, got {port!r}")
    return port


def _check_gateway(gateway: str) -> str:
    try:
        return str(ipaddress.IPv4Address(gateway))
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise InvalidArgument(f"gateway {gateway!r} is not an IPv4 address") from None


def render_egress_table(
    table: str, veth_prefix: str, gateway: str, ports: Mapping[str, int]
) -> str:
    """The ``nft -f`` text that (re)places table ``ip <table>``.

    ``ports`` maps host veth names (each must start with ``veth_prefix``) to the port of
    that actor's egress listener on ``gateway``. With no ports the table only drops.
    Rules are emitted in sorted veth order, so equal inputs give equal text.
    """
    check_table_name(table)
    check_ifname(veth_prefix, what="veth prefix", max_len=IFNAME_MAX - 1)
    gw = _check_gateway(gateway)
    entries: list[tuple[str, int]] = []
    for veth in sorted(ports):
        check_ifname(veth, what="host veth name")
        if not veth.startswith(veth_prefix):
            raise InvalidArgument(f"host veth {veth!r} does not start with {veth_prefix!r}")
        entries.append((veth, _check_port(veth, ports[veth])))
    # Two veths may share a port: each actor's listener is bound to its own veth, and the
    # input rule matches veth, address and port together.

    match = f'iifname "{veth_prefix}*"'
    lines = [
        f"table ip {table} {{}}",
        f"delete table ip {table}",
        f"table ip {table} {{",
        "\tchain prerouting {",
        "\t\ttype nat hook prerouting priority dstnat; policy accept;",
    ]
    if entries:
        redirect_map = ", ".join(f'"{veth}" : {port}' for veth, port in entries)
        lines.append(f"\t\t{match} meta l4proto tcp redirect to : iifname map {{ {redirect_map} }}")
    lines += [
        "\t}",
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        f"\t\t{match} ct state established,related accept",
        f"\t\t{match} meta l4proto icmp accept",
    ]
    if entries:
        allowed = ", ".join(f'"{veth}" . {gw} . {port}' for veth, port in entries)
        lines.append(f"\t\tiifname . ip daddr . tcp dport {{ {allowed} }} accept")
    lines += [
        f"\t\t{match} drop",
        "\t}",
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter; policy accept;",
        f"\t\t{match} drop",
        f'\t\toifname "{veth_prefix}*" drop',
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"


def render_delete_table(table: str) -> str:
    """The ``nft -f`` text that deletes ``ip <table>``, whether or not it exists."""
    check_table_name(table)
    return f"table ip {table} {{}}\ndelete table ip {table}\n"


__all__ = [
    "IFNAME_MAX",
    "TABLE_NAME_MAX",
    "check_ifname",
    "check_table_name",
    "render_delete_table",
    "render_egress_table",
]
