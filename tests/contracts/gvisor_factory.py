"""The gVisor runtime under the sandbox conformance suite: real runsc, real network namespaces.

Per ``spec(actor_uid, namespace)`` the factory makes a fresh network namespace with the
recipe of ``docs/gvisor/netns.sh`` — ``169.254.17.2/30`` on ``eth0`` inside, the host veth
with ``169.254.17.1/30`` outside — unpacks the counter image (built once per session) into
a bundle, and reports the host veth as ``spec.device`` so the suite's client connects
with ``SO_BINDTODEVICE`` (every namespace has the same address). ``prepare`` puts the
namespace's address and route back before each run or restore (runsc strips them). Each
runtime gets its own ``--root`` (two runtimes are two workers).

Names start with ``tgv`` (``tgvn…`` namespaces, ``tgvh…`` host veths). Everything is
removed when its context ends, and checked: a context that ends normally asserts that its
namespace, veth, runsc containers and runsc processes are gone, and every new factory
first asserts that nothing an earlier one made is left.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread

from substrate.adapters.gvisor import procfs
from substrate.adapters.gvisor.images import build_counter_image, unpack_rootfs
from substrate.adapters.gvisor.runtime import RunscRuntime, cleanup_root, parse_list
from substrate.core.ids import TemplateRef
from substrate.core.model import ActorTemplate, Container, Probe, Resources
from substrate.sandbox.ports import SandboxRuntime
from substrate.sandbox.runsc_argv import RunscOptions, list_argv
from substrate.sandbox.spec import SandboxSpec, netns_path_for
from substrate.testing.contracts.sandbox import SandboxFactory

PREFIX: Final = "tgv"
NETNS_PREFIX: Final = PREFIX + "n"
HOSTIF_PREFIX: Final = PREFIX + "h"
HOST_IP: Final = "169.254.17.1/30"
SANDBOX_IP: Final = "169.254.17.2/30"
HOST_MAC: Final = "02:00:a9:fe:11:01"
SANDBOX_MAC: Final = "02:00:a9:fe:11:02"
IMAGE_CACHE: Final = Path(tempfile.gettempdir()) / "substrate-tgv-images"

TEMPLATE: Final = ActorTemplate(
    ref=TemplateRef("as1", "web"),
    containers=(
        Container(
            name="main",
            image="local/counter:1",
            command=("/bin/counter", "--port", "80"),
            ports=(80,),
            wakeup_probe=Probe(path="/readyz", port=80),
        ),
    ),
    resources=Resources(cpu_milli=250, memory_bytes=64 << 20),
)

_image: Path | None = None
_made_links: set[tuple[str, str]] = set()
"""(netns, host veth) pairs this process made."""
_made_roots: set[str] = set()


def counter_image() -> Path:
    """The counter image, built once per session (and cached across sessions by source)."""
    global _image
    if _image is None:
        _image = build_counter_image(IMAGE_CACHE / "counter_1")
    return _image


async def ip(*args: str, check: bool = True) -> None:
    done = await anyio.run_process(["ip", *args], check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")


async def netns_up(netns: str, hostif: str) -> None:
    """``netns.sh up``: the namespace, its veth pair, addresses and the one route out."""
    await ip("netns", "add", netns)
    await ip(
        "link", "add", hostif, "address", HOST_MAC, "type", "veth",
        "peer", "name", "eth0", "address", SANDBOX_MAC, "netns", netns,
    )  # fmt: skip
    await ip("addr", "add", HOST_IP, "dev", hostif)
    await ip("link", "set", hostif, "up")
    sandbox_ip = SANDBOX_IP.split("/")[0]
    await ip(
        "neigh", "replace", sandbox_ip, "lladdr", SANDBOX_MAC, "dev", hostif, "nud", "permanent"
    )
    await ip("-n", netns, "link", "set", "lo", "up")
    await ip("-n", netns, "addr", "add", SANDBOX_IP, "dev", "eth0")
    await ip("-n", netns, "link", "set", "eth0", "up")
    await netns_reconf(netns)


async def netns_reconf(netns: str) -> None:
    """``netns.sh reconf``: the address and default route runsc took away, back."""
    await ip("-n", netns, "addr", "replace", SANDBOX_IP, "dev", "eth0")
    await ip(
        "-n", netns, "route", "replace", "default", "via", HOST_IP.split("/")[0], "dev", "eth0"
    )


async def netns_down(netns: str, hostif: str) -> None:
    await ip("netns", "del", netns, check=False)
    await ip("link", "del", hostif, check=False)


def _netns_exists(netns: str) -> bool:
    return os.path.exists(netns_path_for(netns))


def _link_exists(hostif: str) -> bool:
    return os.path.exists(f"/sys/class/net/{hostif}")


def root_leftovers(root: str) -> list[str]:
    """runsc containers and processes still on state dir ``root`` (blocking)."""
    found: list[str] = []
    if os.path.isdir(root):
        argv = list_argv(RunscOptions(root=root))
        done = subprocess.run(argv, capture_output=True, check=False, timeout=30)
        found += [f"container {sid}" for sid in parse_list(done.stdout.decode())]
    strays = procfs.processes_of_root(root)
    found += [f"process {pid} {' '.join(argv)[:80]}" for pid, argv in strays]
    return found


def assert_nothing_left() -> None:
    """No namespace, veth, runsc container or runsc process this process made remains."""
    left = [f"netns {ns}" for ns, _ in _made_links if _netns_exists(ns)]
    left += [f"veth {hif}" for _, hif in _made_links if _link_exists(hif)]
    for root in sorted(_made_roots):
        left += root_leftovers(root)
    assert not left, f"gVisor test resources left behind: {left}"


def gvisor_factory(tmp_path: Path) -> SandboxFactory:
    assert_nothing_left()  # what earlier tests made is gone
    image = counter_image()
    counter = iter(range(1_000_000))

    @asynccontextmanager
    async def open_runtime() -> AsyncIterator[SandboxRuntime]:
        root = str(tmp_path / f"runsc-{next(counter)}")
        _made_roots.add(root)
        runtime = RunscRuntime(RunscOptions(root=root), log_dir=str(tmp_path / "logs"))
        clean = False
        try:
            async with runtime:
                yield runtime
            clean = True
        finally:
            with anyio.CancelScope(shield=True):
                left = await anyio.to_thread.run_sync(root_leftovers, root)
                await cleanup_root(root)
        if clean:
            assert not left, f"the runtime left {left} behind in {root}"

    @asynccontextmanager
    async def open_spec(actor_uid: str, namespace: str) -> AsyncIterator[SandboxSpec]:
        tag = secrets.token_hex(3)
        netns, hostif = NETNS_PREFIX + tag, HOSTIF_PREFIX + tag
        _made_links.add((netns, hostif))
        clean = False
        try:
            await netns_up(netns, hostif)
            bundle = tmp_path / "bundles" / f"{namespace}-{tag}" / actor_uid
            sysinfo = tmp_path / "sysinfo" / f"{namespace}-{tag}"
            await anyio.to_thread.run_sync(_write_sysinfo, sysinfo, actor_uid)
            config = await anyio.to_thread.run_sync(unpack_rootfs, image, bundle)
            yield SandboxSpec.from_template(
                TEMPLATE,
                actor_uid=actor_uid,
                bundle_dir=str(bundle),
                netns_path=netns_path_for(netns),
                image_args=config.args,
                address=SANDBOX_IP.split("/")[0],
                device=hostif,
                sysinfo_dir=str(sysinfo),
            )
            clean = True
        finally:
            with anyio.CancelScope(shield=True):
                await netns_down(netns, hostif)
        if clean:
            assert not _netns_exists(netns), f"netns {netns} is still there"
            assert not _link_exists(hostif), f"veth {hostif} is still there"

    async def prepare(spec: SandboxSpec) -> None:
        await netns_reconf(os.path.basename(spec.netns_path))

    return SandboxFactory(
        name="gvisor",
        open_runtime=open_runtime,
        open_spec=open_spec,
        scratch_dir=str(tmp_path),
        prepare_by=prepare,
        checkpoint_fails_with_open_connections=True,
    )


def _write_sysinfo(directory: Path, actor_uid: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in (("atespace", "as1"), ("name", actor_uid), ("uid", actor_uid)):
        (directory / name).write_text(value + "\n")


__all__ = [
    "HOSTIF_PREFIX",
    "NETNS_PREFIX",
    "assert_nothing_left",
    "counter_image",
    "gvisor_factory",
    "netns_down",
    "netns_reconf",
    "netns_up",
    "root_leftovers",
]
