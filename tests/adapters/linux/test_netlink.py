"""``LinuxHostNetwork`` beyond the contract: speed, leftovers, IPv6, privileges, traffic."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator

import anyio
import attrs
import pytest

from substrate.adapters.linux import LinuxHostNetwork
from substrate.errors import InvalidArgument
from substrate.net.plan import ActorNetworkPlan
from tests.adapters.linux.nsutil import cleanup, ip_json, leftovers, run, socket_in_netns
from tests.privileges import needs_netns

pytestmark = [pytest.mark.anyio, needs_netns]


@attrs.frozen
class Names:
    netns_prefix: str
    veth_prefix: str

    def plan(self, key: str) -> ActorNetworkPlan:
        return ActorNetworkPlan(netns=self.netns_prefix + key, host_veth=self.veth_prefix + key)


@pytest.fixture
def names() -> Iterator[Names]:
    tag = secrets.token_hex(2)
    found = Names(netns_prefix=f"tnet-{tag}-", veth_prefix=f"tnl{tag}")
    try:
        yield found
    finally:
        cleanup(found.netns_prefix, found.veth_prefix)
    assert leftovers(found.netns_prefix, found.veth_prefix) == []


async def test_create_replaces_leftovers(names: Names) -> None:
    net = LinuxHostNetwork()
    plan = names.plan("l1")
    # a link with the host veth's name, and an empty file where the namespace goes
    run("ip", "link", "add", plan.host_veth, "type", "dummy")
    await anyio.Path(plan.netns_path).parent.mkdir(parents=True, exist_ok=True)
    await anyio.Path(plan.netns_path).touch()
    assert not await net.exists(plan), "an empty file is not a namespace"
    await net.create(plan)
    assert await net.exists(plan)
    (link,) = ip_json("-d", "link", "show", "dev", plan.host_veth)
    assert link["linkinfo"] == {"info_kind": "veth"}
    await net.destroy(plan)
    assert not await anyio.Path(plan.netns_path).exists()


async def test_ipv6_is_off_and_reverse_paths_loose_on_the_host_veth(names: Names) -> None:
    net = LinuxHostNetwork()
    plan = names.plan("v6")
    await net.create(plan)
    conf = anyio.Path(f"/proc/sys/net/ipv6/conf/{plan.host_veth}/disable_ipv6")
    if await conf.exists():
        assert (await conf.read_text()).strip() == "1"
    rp_filter = anyio.Path(f"/proc/sys/net/ipv4/conf/{plan.host_veth}/rp_filter")
    assert (await rp_filter.read_text()).strip() == "2"
    assert ip_json("-6", "addr", "show", "dev", plan.host_veth) in ([], [{}])
    inner = ip_json("-n", plan.netns, "-6", "addr", "show", "dev", plan.actor_ifname)
    assert all(not link.get("addr_info") for link in inner)


async def test_the_host_reaches_each_actor_through_its_own_veth(names: Names) -> None:
    """Two actors with the same address: a socket bound to a veth reaches that actor."""
    net = LinuxHostNetwork()
    plans = [names.plan("t1"), names.plan("t2")]
    listeners = []
    try:
        for plan in plans:
            await net.create(plan)
            sock = socket_in_netns(plan.netns_path)
            sock.bind((plan.actor_address, 8080))
            sock.listen()
            sock.settimeout(5)
            listeners.append(sock)

        def probe(plan: ActorNetworkPlan, listener: socket.socket) -> bool:
            with socket.socket() as client:
                client.setsockopt(
                    socket.SOL_SOCKET, socket.SO_BINDTODEVICE, plan.host_veth.encode()
                )
                client.settimeout(5)
                client.connect((plan.actor_address, 8080))
                accepted, _ = listener.accept()
                with accepted:
                    return bool(accepted.getpeername()[0] == plan.gateway_address)

        for plan, listener in zip(plans, listeners, strict=True):
            assert await anyio.to_thread.run_sync(probe, plan, listener)
    finally:
        for sock in listeners:
            sock.close()


async def test_reconfigure_after_the_actor_side_lost_everything(names: Names) -> None:
    net = LinuxHostNetwork()
    plan = names.plan("rc")
    await net.create(plan)
    run("ip", "-n", plan.netns, "link", "set", plan.actor_ifname, "down")
    run("ip", "-n", plan.netns, "addr", "flush", "dev", plan.actor_ifname)
    await net.reconfigure(plan)
    (link,) = ip_json("-n", plan.netns, "addr", "show", "dev", plan.actor_ifname)
    assert "UP" in link["flags"]  # type: ignore[operator]
    routes = ip_json("-n", plan.netns, "route", "show", "default")
    assert [r.get("gateway") for r in routes] == [plan.gateway_address]


async def test_concurrent_creates(names: Names) -> None:
    net = LinuxHostNetwork()
    plans = [names.plan(f"c{i}") for i in range(6)]
    async with anyio.create_task_group() as tg:
        for plan in plans:
            tg.start_soon(net.create, plan)
    namespaces, veths = await net.owned(names.netns_prefix, names.veth_prefix)
    assert namespaces == sorted(p.netns for p in plans)
    assert veths == sorted(p.host_veth for p in plans)
    await net.remove_owned(names.netns_prefix, names.veth_prefix)
    assert await net.owned(names.netns_prefix, names.veth_prefix) == ([], [])


async def test_a_plan_outside_the_namespace_directory_is_rejected(names: Names) -> None:
    net = LinuxHostNetwork(netns_dir="/tmp/elsewhere")
    with pytest.raises(InvalidArgument, match="not in /tmp/elsewhere"):
        await net.create(names.plan("x"))


def test_without_privileges_it_is_unavailable(names: Names) -> None:
    plan = names.plan("np")
    script = (
        "import anyio\n"
        "from substrate.adapters.linux import LinuxHostNetwork\n"
        "from substrate.net.plan import ActorNetworkPlan\n"
        "from substrate.errors import Unavailable\n"
        "async def main():\n"
        f"    plan = ActorNetworkPlan(netns={plan.netns!r}, host_veth={plan.host_veth!r})\n"
        "    try:\n"
        "        await LinuxHostNetwork().create(plan)\n"
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
    assert "not permitted" in done.stdout
