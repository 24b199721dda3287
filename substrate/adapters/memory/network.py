"""An in-memory :class:`~substrate.net.ports.HostNetwork` for tests and the simulator.

It creates nothing: it records which namespaces and host veths exist (with the plan
that made them), whether the actor side still has its address and route (runsc strips
them; :meth:`FakeHostNetwork.strip` plays that part), and the egress tables with the
exact text :class:`~substrate.adapters.linux.netlink.LinuxHostNetwork` would load.
Input is validated as the real adapter does, so a bad table name or a veth outside the
prefix fails here too.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio.lowlevel
import attrs

from substrate.errors import InvalidArgument, NotFound
from substrate.net.nft_ruleset import render_delete_table, render_egress_table
from substrate.net.plan import GATEWAY_ADDRESS, ActorNetworkPlan


@attrs.frozen(slots=True, kw_only=True)
class FakeNamespace:
    """What the fake holds for one namespace."""

    plan: ActorNetworkPlan
    configured: bool = True
    """The actor side has its address and default route (False after :meth:`strip`)."""


@attrs.frozen(slots=True, kw_only=True)
class FakeEgressTable:
    """One installed egress table."""

    veth_prefix: str
    ports: Mapping[str, int]
    ruleset: str
    """The ``nft -f`` text the real adapter would have loaded."""


def _check_prefix(prefix: str, what: str) -> None:
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise InvalidArgument(f"{what} must be a non-empty name prefix, got {prefix!r}")


class FakeHostNetwork:
    """Records namespaces, veths and egress tables; does no I/O.

    ``namespaces`` (by name), ``veths`` (host veth → namespace name) and ``tables``
    (by table name) are the state; ``calls`` lists every call as ``(method, name)``.
    ``fail_next(method, error)`` makes the next call of ``method`` raise ``error``.
    """

    def __init__(self, *, gateway: str = GATEWAY_ADDRESS) -> None:
        self.gateway = gateway
        self.namespaces: dict[str, FakeNamespace] = {}
        self.veths: dict[str, str] = {}
        self.tables: dict[str, FakeEgressTable] = {}
        self.calls: list[tuple[str, str]] = []
        self._failures: dict[str, Exception] = {}

    # --- test hooks -------------------------------------------------------------------

    def fail_next(self, method: str, error: Exception) -> None:
        """Make the next call of ``method`` (e.g. ``"set_egress"``) raise ``error``."""
        self._failures[method] = error

    def strip(self, plan: ActorNetworkPlan) -> None:
        """Take the actor side's address and route away, as runsc does on start."""
        found = self.namespaces.get(plan.netns)
        if found is None:
            raise NotFound(f"network namespace {plan.netns!r} does not exist")
        self.namespaces[plan.netns] = attrs.evolve(found, configured=False)

    def ports(self, table: str) -> dict[str, int] | None:
        """The veth → port map of ``table``, or ``None`` if it is not installed."""
        found = self.tables.get(table)
        return None if found is None else dict(found.ports)

    async def _enter(self, method: str, name: str) -> None:
        await anyio.lowlevel.checkpoint()
        self.calls.append((method, name))
        error = self._failures.pop(method, None)
        if error is not None:
            raise error

    # --- HostNetwork ------------------------------------------------------------------

    async def create(self, plan: ActorNetworkPlan) -> None:
        await self._enter("create", plan.netns)
        self._remove(plan)
        self.namespaces[plan.netns] = FakeNamespace(plan=plan)
        self.veths[plan.host_veth] = plan.netns

    async def reconfigure(self, plan: ActorNetworkPlan) -> None:
        await self._enter("reconfigure", plan.netns)
        found = self.namespaces.get(plan.netns)
        if found is None:
            raise NotFound(f"network namespace {plan.netns!r} does not exist")
        self.namespaces[plan.netns] = attrs.evolve(found, plan=plan, configured=True)

    def _remove(self, plan: ActorNetworkPlan) -> None:
        self.namespaces.pop(plan.netns, None)
        self.veths.pop(plan.host_veth, None)
        for veth, netns in list(self.veths.items()):
            if netns == plan.netns:
                del self.veths[veth]

    async def destroy(self, plan: ActorNetworkPlan) -> None:
        await self._enter("destroy", plan.netns)
        self._remove(plan)

    async def exists(self, plan: ActorNetworkPlan) -> bool:
        await self._enter("exists", plan.netns)
        return plan.netns in self.namespaces

    async def owned(self, netns_prefix: str, veth_prefix: str) -> tuple[list[str], list[str]]:
        await self._enter("owned", netns_prefix)
        _check_prefix(netns_prefix, "namespace prefix")
        _check_prefix(veth_prefix, "veth prefix")
        return (
            sorted(n for n in self.namespaces if n.startswith(netns_prefix)),
            sorted(v for v in self.veths if v.startswith(veth_prefix)),
        )

    async def remove_owned(self, netns_prefix: str, veth_prefix: str) -> None:
        await self._enter("remove_owned", netns_prefix)
        _check_prefix(netns_prefix, "namespace prefix")
        _check_prefix(veth_prefix, "veth prefix")
        for veth in [v for v in self.veths if v.startswith(veth_prefix)]:
            del self.veths[veth]
        for name in [n for n in self.namespaces if n.startswith(netns_prefix)]:
            del self.namespaces[name]

    async def set_egress(self, table: str, veth_prefix: str, ports: Mapping[str, int]) -> None:
        await self._enter("set_egress", table)
        ruleset = render_egress_table(table, veth_prefix, self.gateway, ports)
        self.tables[table] = FakeEgressTable(
            veth_prefix=veth_prefix, ports=dict(ports), ruleset=ruleset
        )

    async def remove_egress(self, table: str) -> None:
        await self._enter("remove_egress", table)
        render_delete_table(table)  # validates the name as the real adapter does
        self.tables.pop(table, None)


__all__ = ["FakeEgressTable", "FakeHostNetwork", "FakeNamespace"]
