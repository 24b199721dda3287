"""Which destinations an actor may open TCP connections to (pure).

An :class:`EgressPolicy` is an allow-list; anything it does not list is denied. Each
entry is ``CIDR[:port]`` (a bare address counts as a /32):

* ``10.0.0.0/8`` — any port of any address in 10.0.0.0/8;
* ``192.0.2.7:443`` — port 443 of 192.0.2.7 only;
* ``0.0.0.0/0:443`` — port 443 anywhere.

The egress proxy checks the address the actor asked for (``SO_ORIGINAL_DST`` of the
redirected connection) against the actor's policy. Only IPv4: the egress redirect
handles IPv4 alone, and IPv6 is disabled on actor veths.

:class:`EgressUpstream` is the optional upstream proxy (``host:port``) that allowed
connections are tunnelled through with HTTP ``CONNECT``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Final

import attrs

from substrate.errors import InvalidArgument

_FORMAT: Final = "expected CIDR[:port], e.g. 10.0.0.0/8, 192.0.2.7:443 or 0.0.0.0/0:443"
_PORT_RE: Final = re.compile(r"[0-9]{1,5}")
_HOST_RE: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def _parse_port(text: str, *, what: str) -> int:
    if _PORT_RE.fullmatch(text) is None or not 1 <= int(text) <= 65535:
        raise InvalidArgument(f"{what}: port {text!r} is not a number from 1 to 65535")
    return int(text)


@attrs.frozen(slots=True)
class EgressRule:
    """One allow-list entry: a network and, optionally, one port."""

    network: ipaddress.IPv4Network
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> EgressRule:
        """Parse ``CIDR[:port]``; ``InvalidArgument`` says what is wrong with ``entry``."""
        if not isinstance(entry, str):
            raise InvalidArgument(f"egress rule {entry!r} is not a string; {_FORMAT}")
        text = entry.strip()
        what = f"egress rule {entry!r}"
        if not text:
            raise InvalidArgument(f"empty egress rule; {_FORMAT}")
        if text.startswith("[") or text.count(":") > 1:
            raise InvalidArgument(f"{what}: IPv6 is not supported; {_FORMAT}")
        address, sep, port_text = text.partition(":")
        port = _parse_port(port_text, what=what) if sep else None
        try:
            network = ipaddress.IPv4Network(address, strict=True)
        except ipaddress.NetmaskValueError:
            raise InvalidArgument(
                f"{what}: {address!r} has a bad prefix length; {_FORMAT}"
            ) from None
        except ValueError as exc:
            if "has host bits set" in str(exc):
                raise InvalidArgument(
                    f"{what}: {address!r} has host bits set "
                    f"(did you mean {ipaddress.IPv4Network(address, strict=False)}?)"
                ) from None
            raise InvalidArgument(
                f"{what}: {address!r} is not an IPv4 address or network; {_FORMAT}"
            ) from None
        return cls(network, port)

    def allows(self, address: ipaddress.IPv4Address, port: int) -> bool:
        return address in self.network and (self.port is None or self.port == port)

    def __str__(self) -> str:
        text = str(self.network)
        if self.network.prefixlen == 32:
            text = str(self.network.network_address)
        return text if self.port is None else f"{text}:{self.port}"


@attrs.frozen(slots=True)
class EgressPolicy:
    """An allow-list of :class:`EgressRule`; the empty policy denies everything."""

    rules: tuple[EgressRule, ...] = ()

    @classmethod
    def parse(cls, entries: str | Iterable[str]) -> EgressPolicy:
        """A policy from entries, or from one string of entries separated by commas/spaces."""
        if isinstance(entries, str):
            items = [item for item in re.split(r"[\s,]+", entries) if item]
        else:
            items = list(entries)
        return cls(tuple(EgressRule.parse(item) for item in items))

    @classmethod
    def deny_all(cls) -> EgressPolicy:
        return cls(())

    def allows(self, address: str, port: int) -> bool:
        """Whether an actor may connect to ``address:port`` (anything malformed: no)."""
        try:
            ip = ipaddress.IPv4Address(address)
        except (ipaddress.AddressValueError, ValueError):
            return False
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            return False
        return any(rule.allows(ip, port) for rule in self.rules)

    def __str__(self) -> str:
        return ",".join(str(rule) for rule in self.rules) or "deny-all"


@attrs.frozen(slots=True)
class EgressUpstream:
    """An upstream HTTP proxy that allowed connections go through (``CONNECT``)."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> EgressUpstream:
        """``host:port`` (a name or an IPv4 address)."""
        what = f"egress upstream proxy {text!r}"
        if not isinstance(text, str):
            raise InvalidArgument(f"{what} is not a string; expected host:port")
        host, sep, port_text = text.strip().rpartition(":")
        if not sep or not host:
            raise InvalidArgument(f"{what}: expected host:port, e.g. proxy.internal:3128")
        if _HOST_RE.fullmatch(host) is None:
            raise InvalidArgument(f"{what}: {host!r} is not a host name or IPv4 address")
        return cls(host, _parse_port(port_text, what=what))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


__all__ = ["EgressPolicy", "EgressRule", "EgressUpstream"]
