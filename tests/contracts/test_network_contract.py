"""Every HostNetwork case against the fake and against Linux (root, nftables)."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import pytest

from substrate.adapters.linux import LinuxHostNetwork
from substrate.adapters.memory.network import FakeHostNetwork
from substrate.net.plan import ActorNetworkPlan
from substrate.net.ports import HostNetwork
from substrate.testing.contracts.network import (
    NETWORK_CASES,
    LinkView,
    NetworkCase,
    NetworkFactory,
)
from tests.privileges import needs_nft

# --- the fake ---------------------------------------------------------------------------


class FakeObserver:
    def __init__(self, net: FakeHostNetwork) -> None:
        self.net = net

    async def namespace_exists(self, name: str) -> bool:
        return name in self.net.namespaces

    async def host_side(self, plan: ActorNetworkPlan) -> LinkView | None:
        netns = self.net.veths.get(plan.host_veth)
        if netns is None:
            return None
        made = self.net.namespaces[netns].plan
        return LinkView(
            mac=made.gateway_mac,
            up=True,
            addresses=(f"{made.gateway_address}/{made.prefix_len}",),
            peer_mac=made.actor_mac,
        )

    async def actor_side(self, plan: ActorNetworkPlan) -> LinkView | None:
        found = self.net.namespaces.get(plan.netns)
        if found is None:
            return None
        made = found.plan
        if not found.configured:
            return LinkView(mac=made.actor_mac, up=True, addresses=())
        return LinkView(
            mac=made.actor_mac,
            up=True,
            addresses=(f"{made.actor_address}/{made.prefix_len}",),
            default_gateway=made.gateway_address,
        )

    async def strip(self, plan: ActorNetworkPlan) -> None:
        self.net.strip(plan)

    async def egress_ruleset(self, table: str) -> str | None:
        found = self.net.tables.get(table)
        return None if found is None else found.ruleset


def fake_factory() -> NetworkFactory:
    net = FakeHostNetwork()

    @asynccontextmanager
    async def open_network() -> AsyncIterator[HostNetwork]:
        yield net

    return NetworkFactory(
        name="fake",
        observer=FakeObserver(net),
        netns_prefix="tnet-f-",
        veth_prefix="tnf",
        table_prefix="tnet_f",
        open_network=open_network,
    )


# --- Linux: observed with ip -j and nft -------------------------------------------------


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=10)


def _json(*argv: str) -> list[dict[str, object]]:
    done = _run(*argv, check=False)
    if done.returncode != 0:
        return []
    found: list[dict[str, object]] = json.loads(done.stdout or "[]")
    return found


def _addresses(link: dict[str, object]) -> tuple[str, ...]:
    infos = link.get("addr_info", [])
    assert isinstance(infos, list)
    return tuple(
        f"{info['local']}/{info['prefixlen']}" for info in infos if info.get("family") == "inet"
    )


def namespace_names() -> list[str]:
    return [str(ns["name"]) for ns in _json("ip", "-j", "netns", "list")]


def link_names() -> list[str]:
    return [str(link["ifname"]) for link in _json("ip", "-j", "link", "show")]


def table_names() -> list[str]:
    done = _run("nft", "-j", "list", "tables")
    tables = json.loads(done.stdout)["nftables"]
    return [t["table"]["name"] for t in tables if "table" in t and t["table"]["family"] == "ip"]


class LinuxObserver:
    async def namespace_exists(self, name: str) -> bool:
        return name in await anyio.to_thread.run_sync(namespace_names)

    async def host_side(self, plan: ActorNetworkPlan) -> LinkView | None:
        def look() -> LinkView | None:
            links = _json("ip", "-j", "addr", "show", "dev", plan.host_veth)
            if not links:
                return None
            link = links[0]
            neigh = [
                n
                for n in _json("ip", "-j", "neigh", "show", "dev", plan.host_veth)
                if n.get("dst") == plan.actor_address and "PERMANENT" in str(n.get("state"))
            ]
            return LinkView(
                mac=str(link["address"]),
                up="UP" in str(link["flags"]),
                addresses=_addresses(link),
                peer_mac=str(neigh[0]["lladdr"]) if neigh else None,
            )

        return await anyio.to_thread.run_sync(look)

    async def actor_side(self, plan: ActorNetworkPlan) -> LinkView | None:
        def look() -> LinkView | None:
            ns = ("ip", "-n", plan.netns, "-j")
            links = _json(*ns, "addr", "show", "dev", plan.actor_ifname)
            if not links:
                return None
            link = links[0]
            routes = _json(*ns, "route", "show", "default")
            gateway = next((str(r["gateway"]) for r in routes if "gateway" in r), None)
            return LinkView(
                mac=str(link["address"]),
                up="UP" in str(link["flags"]),
                addresses=_addresses(link),
                default_gateway=gateway,
            )

        return await anyio.to_thread.run_sync(look)

    async def strip(self, plan: ActorNetworkPlan) -> None:
        def strip() -> None:
            _run("ip", "-n", plan.netns, "route", "flush", "dev", plan.actor_ifname)
            _run("ip", "-n", plan.netns, "addr", "flush", "dev", plan.actor_ifname)

        await anyio.to_thread.run_sync(strip)

    async def egress_ruleset(self, table: str) -> str | None:
        done = await anyio.run_process(["nft", "list", "table", "ip", table], check=False)
        return done.stdout.decode() if done.returncode == 0 else None


def cleanup_linux(factory: NetworkFactory) -> None:
    """Remove, by exact name, whatever a Linux case left with its prefixes."""
    for veth in link_names():
        if veth.startswith(factory.veth_prefix):
            _run("ip", "link", "del", veth, check=False)
    for name in namespace_names():
        if name.startswith(factory.netns_prefix):
            _run("ip", "netns", "del", name, check=False)
    for table in table_names():
        if table.startswith(factory.table_prefix + "_"):
            _run("nft", "delete", "table", "ip", table, check=False)


def assert_nothing_left(factory: NetworkFactory) -> None:
    assert [n for n in namespace_names() if n.startswith(factory.netns_prefix)] == []
    assert [v for v in link_names() if v.startswith(factory.veth_prefix)] == []
    assert [t for t in table_names() if t.startswith(factory.table_prefix + "_")] == []


def linux_factory() -> NetworkFactory:
    tag = secrets.token_hex(2)

    @asynccontextmanager
    async def open_network() -> AsyncIterator[HostNetwork]:
        yield LinuxHostNetwork()

    return NetworkFactory(
        name="linux",
        observer=LinuxObserver(),
        netns_prefix=f"tnet-{tag}-",
        veth_prefix=f"tnc{tag}",
        table_prefix=f"tnet_{tag}",
        open_network=open_network,
    )


@pytest.fixture(
    params=[
        pytest.param("fake", id="fake"),
        pytest.param("linux", id="linux", marks=needs_nft),
    ]
)
def make_network(request: pytest.FixtureRequest) -> Iterator[NetworkFactory]:
    if request.param == "fake":
        yield fake_factory()
        return
    factory = linux_factory()
    try:
        yield factory
    finally:
        cleanup_linux(factory)
    assert_nothing_left(factory)


@pytest.mark.anyio
@pytest.mark.parametrize("case", NETWORK_CASES, ids=lambda case: case.__name__)
async def test_network_contract(case: NetworkCase, make_network: NetworkFactory) -> None:
    with anyio.fail_after(30):
        await case(make_network)
