"""The HostNetwork conformance suite: every case runs unchanged against every adapter.

A case gets a :class:`MakeNetwork`: it opens the adapter under test, hands out plans,
prefixes and table names that belong to the test alone, and an observer that looks at
the result *independently of the adapter* (for the Linux adapter: ``ip -j`` and
``nft``; for the fake: its recorded state). A factory must remove everything with its
prefixes and tables when ``network()`` exits, even when a case fails.

Run the suite with, e.g.::

    @pytest.mark.parametrize("case", NETWORK_CASES, ids=lambda c: c.__name__)
    async def test_network_contract(case, make_network):
        await case(make_network)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import attrs

from substrate.errors import InvalidArgument, NotFound
from substrate.net.plan import ActorNetworkPlan
from substrate.net.ports import HostNetwork
from substrate.testing.contracts.store import raises


@attrs.frozen(slots=True, kw_only=True)
class LinkView:
    """One end of an actor's veth as the observer sees it."""

    mac: str
    up: bool
    addresses: tuple[str, ...]
    """IPv4 ``address/prefixlen`` on the link."""
    default_gateway: str | None = None
    """The default route's gateway (actor side only)."""
    peer_mac: str | None = None
    """The permanent neighbour entry's MAC for the actor address (host side only)."""


class NetworkObserver(Protocol):
    """Looks at the machine (or the fake's state) without going through the adapter."""

    async def namespace_exists(self, name: str) -> bool: ...

    async def host_side(self, plan: ActorNetworkPlan) -> LinkView | None:
        """The host veth in the worker's namespace, or ``None`` if it does not exist."""
        ...

    async def actor_side(self, plan: ActorNetworkPlan) -> LinkView | None:
        """``eth0`` inside the plan's namespace, or ``None``."""
        ...

    async def strip(self, plan: ActorNetworkPlan) -> None:
        """Remove the actor side's address and routes, as runsc does."""
        ...

    async def egress_ruleset(self, table: str) -> str | None:
        """The installed table as text (``"<veth>" : <port>`` per redirect), or ``None``."""
        ...


class MakeNetwork(Protocol):
    """What a case gets: the adapter, the observer, and names it may use."""

    @property
    def name(self) -> str: ...

    @property
    def observer(self) -> NetworkObserver: ...

    @property
    def netns_prefix(self) -> str: ...

    @property
    def veth_prefix(self) -> str: ...

    def network(self) -> AbstractAsyncContextManager[HostNetwork]: ...

    def plan(self, key: str) -> ActorNetworkPlan:
        """A plan named ``netns_prefix + key`` / ``veth_prefix + key`` (key ≤ 4 chars)."""
        ...

    def table(self, key: str) -> str:
        """A table name of this test's own."""
        ...


NetworkCase = Callable[[MakeNetwork], Awaitable[None]]


@attrs.frozen(slots=True, kw_only=True)
class NetworkFactory:
    """A ready-made :class:`MakeNetwork`."""

    name: str
    observer: NetworkObserver
    netns_prefix: str
    veth_prefix: str
    table_prefix: str
    open_network: Callable[[], AbstractAsyncContextManager[HostNetwork]]

    def network(self) -> AbstractAsyncContextManager[HostNetwork]:
        return self.open_network()

    def plan(self, key: str) -> ActorNetworkPlan:
        return ActorNetworkPlan(netns=self.netns_prefix + key, host_veth=self.veth_prefix + key)

    def table(self, key: str) -> str:
        return f"{self.table_prefix}_{key}"


# --- helpers ----------------------------------------------------------------------------


async def assert_configured(make: MakeNetwork, plan: ActorNetworkPlan) -> None:
    """The namespace and both veth ends look as the plan says."""
    obs = make.observer
    assert await obs.namespace_exists(plan.netns), f"namespace {plan.netns} is missing"
    host = await obs.host_side(plan)
    assert host is not None, f"host veth {plan.host_veth} is missing"
    assert host.up, "host veth is down"
    assert host.mac == plan.gateway_mac
    assert host.addresses == (f"{plan.gateway_address}/{plan.prefix_len}",)
    assert host.peer_mac == plan.actor_mac, "no permanent neighbour entry for the actor"
    actor = await obs.actor_side(plan)
    assert actor is not None, f"{plan.actor_ifname} is missing in {plan.netns}"
    assert actor.up, f"{plan.actor_ifname} is down"
    assert actor.mac == plan.actor_mac
    assert actor.addresses == (f"{plan.actor_address}/{plan.prefix_len}",)
    assert actor.default_gateway == plan.gateway_address


async def assert_gone(make: MakeNetwork, plan: ActorNetworkPlan) -> None:
    obs = make.observer
    assert not await obs.namespace_exists(plan.netns), f"namespace {plan.netns} is left"
    assert await obs.host_side(plan) is None, f"host veth {plan.host_veth} is left"


# --- cases ------------------------------------------------------------------------------


async def create_makes_the_namespace_and_veth(make: MakeNetwork) -> None:
    plan = make.plan("c1")
    async with make.network() as net:
        assert not await net.exists(plan)
        await net.create(plan)
        assert await net.exists(plan)
        await assert_configured(make, plan)


async def create_is_idempotent(make: MakeNetwork) -> None:
    plan = make.plan("c2")
    async with make.network() as net:
        await net.create(plan)
        await make.observer.strip(plan)
        await net.create(plan)  # whatever was there is made afresh
        await assert_configured(make, plan)
        namespaces, veths = await net.owned(make.netns_prefix, make.veth_prefix)
        assert namespaces == [plan.netns]
        assert veths == [plan.host_veth]


async def reconfigure_puts_address_and_route_back(make: MakeNetwork) -> None:
    plan = make.plan("r1")
    async with make.network() as net:
        await net.create(plan)
        await make.observer.strip(plan)
        stripped = await make.observer.actor_side(plan)
        assert stripped is not None
        assert stripped.addresses == ()
        assert stripped.default_gateway is None
        await net.reconfigure(plan)
        await assert_configured(make, plan)
        await net.reconfigure(plan)  # nothing to put back: still fine
        await assert_configured(make, plan)


async def reconfigure_of_a_missing_namespace_is_not_found(make: MakeNetwork) -> None:
    async with make.network() as net:
        with raises(NotFound):
            await net.reconfigure(make.plan("r2"))


async def destroy_removes_everything_and_is_idempotent(make: MakeNetwork) -> None:
    plan = make.plan("d1")
    async with make.network() as net:
        await net.destroy(plan)  # nothing there yet
        await net.create(plan)
        await net.destroy(plan)
        assert not await net.exists(plan)
        await assert_gone(make, plan)
        await net.destroy(plan)
        assert await net.owned(make.netns_prefix, make.veth_prefix) == ([], [])


async def actors_share_addresses_but_not_veths(make: MakeNetwork) -> None:
    a, b = make.plan("s1"), make.plan("s2")
    async with make.network() as net:
        await net.create(a)
        await net.create(b)
        await assert_configured(make, a)
        await assert_configured(make, b)
        await net.destroy(a)
        await assert_gone(make, a)
        await assert_configured(make, b)


async def owned_and_remove_owned_go_by_prefix(make: MakeNetwork) -> None:
    plans = [make.plan("o1"), make.plan("o2")]
    async with make.network() as net:
        for plan in plans:
            await net.create(plan)
        namespaces, veths = await net.owned(make.netns_prefix, make.veth_prefix)
        assert namespaces == sorted(p.netns for p in plans)
        assert veths == sorted(p.host_veth for p in plans)
        only, _ = await net.owned(plans[0].netns, plans[0].host_veth)
        assert only == [plans[0].netns]
        with raises(InvalidArgument):
            await net.owned("", make.veth_prefix)
        with raises(InvalidArgument):
            await net.remove_owned(make.netns_prefix, "")
        await net.remove_owned(make.netns_prefix, make.veth_prefix)
        assert await net.owned(make.netns_prefix, make.veth_prefix) == ([], [])
        for plan in plans:
            await assert_gone(make, plan)
        await net.remove_owned(make.netns_prefix, make.veth_prefix)  # nothing left: fine


async def set_egress_installs_and_replaces_the_table(make: MakeNetwork) -> None:
    table = make.table("e1")
    v1, v2 = make.veth_prefix + "e1", make.veth_prefix + "e2"
    async with make.network() as net:
        assert await make.observer.egress_ruleset(table) is None
        await net.set_egress(table, make.veth_prefix, {})
        empty = await make.observer.egress_ruleset(table)
        assert empty is not None
        assert "redirect" not in empty
        assert f'iifname "{make.veth_prefix}*"' in empty
        await net.set_egress(table, make.veth_prefix, {v1: 40001, v2: 40002})
        text = await make.observer.egress_ruleset(table)
        assert text is not None
        assert f'"{v1}" : 40001' in text
        assert f'"{v2}" : 40002' in text
        await net.set_egress(table, make.veth_prefix, {v2: 40003})
        text = await make.observer.egress_ruleset(table)
        assert text is not None
        assert f'"{v1}"' not in text
        assert f'"{v2}" : 40003' in text
        await net.remove_egress(table)
        assert await make.observer.egress_ruleset(table) is None
        await net.remove_egress(table)  # already gone: fine


async def set_egress_rejects_bad_input_and_keeps_the_old_table(make: MakeNetwork) -> None:
    table = make.table("e2")
    veth = make.veth_prefix + "e3"
    async with make.network() as net:
        await net.set_egress(table, make.veth_prefix, {veth: 40010})
        with raises(InvalidArgument, match="does not start with"):
            await net.set_egress(table, make.veth_prefix, {"zz" + veth: 40011})
        with raises(InvalidArgument, match="1..65535"):
            await net.set_egress(table, make.veth_prefix, {veth: 0})
        with raises(InvalidArgument, match="table name"):
            await net.set_egress("bad name;", make.veth_prefix, {})
        with raises(InvalidArgument, match="table name"):
            await net.remove_egress("x y")
        text = await make.observer.egress_ruleset(table)
        assert text is not None
        assert f'"{veth}" : 40010' in text
        await net.remove_egress(table)


NETWORK_CASES: tuple[NetworkCase, ...] = (
    create_makes_the_namespace_and_veth,
    create_is_idempotent,
    reconfigure_puts_address_and_route_back,
    reconfigure_of_a_missing_namespace_is_not_found,
    destroy_removes_everything_and_is_idempotent,
    actors_share_addresses_but_not_veths,
    owned_and_remove_owned_go_by_prefix,
    set_egress_installs_and_replaces_the_table,
    set_egress_rejects_bad_input_and_keeps_the_old_table,
)

__all__ = [
    "NETWORK_CASES",
    "LinkView",
    "MakeNetwork",
    "NetworkCase",
    "NetworkFactory",
    "NetworkObserver",
    "assert_configured",
    "assert_gone",
]
