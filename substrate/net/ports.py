"""The host network port: actor namespaces and the worker's egress redirect.

Adapters: :class:`substrate.adapters.linux.netlink.LinuxHostNetwork` (pyroute2 for links
and namespaces, ``nft`` for the redirect; needs root) and
:class:`substrate.adapters.memory.network.FakeHostNetwork`. Both pass
:mod:`substrate.testing.contracts.network`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from substrate.net.plan import ActorNetworkPlan


class HostNetwork(Protocol):
    """Creates and removes actor namespaces; keeps one worker's egress redirect.

    Every host veth carries the same gateway address and routes the same actor /30, so
    a host-side socket that talks to one actor — a probe, a client, or a listener that
    accepts from it (the egress proxy) — must be bound to that actor's host veth
    (``SO_BINDTODEVICE``); otherwise the kernel sends it out of whichever veth has the
    first route.
    """

    async def create(self, plan: ActorNetworkPlan) -> None:
        """Create the namespace and veth pair with addresses and the default route.

        Idempotent: whatever exists under the plan's names is removed and made afresh.
        """
        ...

    async def reconfigure(self, plan: ActorNetworkPlan) -> None:
        """Put the actor side's address and default route back (runsc strips them).

        ``NotFound`` if the namespace does not exist.
        """
        ...

    async def destroy(self, plan: ActorNetworkPlan) -> None:
        """Remove the namespace and the host veth; idempotent."""
        ...

    async def exists(self, plan: ActorNetworkPlan) -> bool:
        """Whether the plan's namespace exists."""
        ...

    async def owned(self, netns_prefix: str, veth_prefix: str) -> tuple[list[str], list[str]]:
        """Sorted names of the namespaces and host veths that start with the prefixes.

        ``InvalidArgument`` for an empty prefix (it would match everything).
        """
        ...

    async def remove_owned(self, netns_prefix: str, veth_prefix: str) -> None:
        """Remove every namespace and host veth with those prefixes (start-up cleanup).

        ``InvalidArgument`` for an empty prefix.
        """
        ...

    async def set_egress(self, table: str, veth_prefix: str, ports: Mapping[str, int]) -> None:
        """Install (replace) the redirect table ``table``.

        Every TCP connection arriving on a host veth that starts with ``veth_prefix`` is
        redirected to the gateway address at ``ports[veth]``; veths without a port and
        anything else from them (UDP, other traffic) are dropped; nothing is forwarded.
        The table is replaced in one transaction, whether or not it existed.
        ``InvalidArgument`` for a bad table name, a veth outside the prefix or a port
        outside 1..65535 (the installed table is then left as it was).
        """
        ...

    async def remove_egress(self, table: str) -> None:
        """Delete the redirect table; idempotent."""
        ...


__all__ = ["HostNetwork"]
