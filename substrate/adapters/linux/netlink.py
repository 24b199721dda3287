"""Actor network namespaces with netlink (pyroute2), and the egress table with ``nft``.

:class:`LinuxHostNetwork` implements :class:`substrate.net.ports.HostNetwork` on the
recipe of the gVisor notes (§1a), without running ``ip``:

* the namespace is made like ``ip netns add`` does it — ``unshare(CLONE_NEWNET)`` and a
  bind mount of the new namespace at ``/var/run/netns/<name>`` (the directory is made a
  shared mount first, so ``ip netns`` and other mount namespaces see it) — but from a
  short-lived thread of this process instead of a child process, because namespaces
  are per thread;
* that thread, now inside the namespace, creates the veth pair there: ``eth0`` with the
  plan's actor MAC stays inside, its peer (the host veth, gateway MAC) is created
  directly in the worker's namespace; it then puts the actor address/30 on ``eth0``,
  brings ``lo`` and ``eth0`` up and adds the default route via the gateway;
* back in the worker's namespace the host veth gets the gateway address/30, goes up,
  and gets a permanent neighbour entry for the actor address (no ARP wait).

IPv6 is disabled on both ends (the egress table is ``ip`` only; an IPv6 link-local
address on the host veth would be a way around it), and the host veth filters reverse
paths loosely (every host veth routes the same actor /30).

Calls that switch namespaces run in a fresh thread that ends afterwards, so no pooled
worker thread is ever left in an actor's namespace. Netlink errors become substrate
errors: ``Unavailable`` when the process is not permitted (it needs root: CAP_NET_ADMIN
and CAP_SYS_ADMIN), ``NotFound`` for a namespace that does not exist, ``Internal``
otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import anyio.to_thread
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from substrate.adapters.linux.nftables import Nftables
from substrate.errors import Internal, InvalidArgument, NotFound, SubstrateError, Unavailable
from substrate.net.nft_ruleset import render_delete_table, render_egress_table
from substrate.net.plan import GATEWAY_ADDRESS, ActorNetworkPlan
from substrate.sandbox.spec import NETNS_DIR

T = TypeVar("T")

_CLONE_NEWNET: Final = 0x40000000
_MS_BIND: Final = 4096
_MS_REC: Final = 16384
_MS_SHARED: Final = 1 << 20
_MNT_DETACH: Final = 2
_THREAD_NETNS: Final = b"/proc/thread-self/ns/net"
_NOT_PERMITTED: Final = frozenset({errno.EPERM, errno.EACCES})
_GONE: Final = frozenset({errno.ENODEV, errno.ENOENT, errno.ESRCH})

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _errno(exc: BaseException) -> int | None:
    if isinstance(exc, NetlinkError):
        code: Any = exc.code
        return int(code) if isinstance(code, int) else None
    if isinstance(exc, OSError):
        return exc.errno
    return None


def _translate(exc: BaseException, what: str) -> SubstrateError:
    if isinstance(exc, SubstrateError):
        return exc
    code = _errno(exc)
    if code in _NOT_PERMITTED:
        return Unavailable(
            f"{what}: not permitted ({os.strerror(code or errno.EPERM)}); "
            "actor networks need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        )
    detail = os.strerror(code) if code else str(exc)
    return Internal(f"{what}: {detail} ({type(exc).__name__}: {exc})")


def _in_fresh_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a new thread and wait: the thread may change namespaces and dies."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name="substrate-netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _enter_netns(path: str) -> None:
    """Move the calling thread into the namespace mounted at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, _CLONE_NEWNET), f"setns {path}")
    finally:
        os.close(fd)


def _write_sysctl(path: str, value: str) -> None:
    """Write a sysctl of the calling thread's namespace; skipped if it does not exist."""
    try:
        with open(path, "w") as f:
            f.write(value)
    except FileNotFoundError:
        pass


def _disable_ipv6(ifname: str) -> None:
    _write_sysctl(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "1")


def _loose_rp_filter(ifname: str) -> None:
    """Loose reverse-path filtering on a host veth (the kernel uses max(all, dev)).

    Every host veth routes the same actor /30, and the route the kernel finds first
    points at one of them: strict filtering (``all.rp_filter=1``) would drop what
    every other actor sends.
    """
    _write_sysctl(f"/proc/sys/net/ipv4/conf/{ifname}/rp_filter", "2")


def _is_netns_mount(path: str) -> bool:
    """Whether something (a namespace) is mounted at ``path``, not just an empty file."""
    try:
        return os.stat(path).st_dev != os.stat(os.path.dirname(path)).st_dev
    except FileNotFoundError:
        return False


def _ensure_shared_dir(directory: str) -> None:
    """Make ``directory`` a shared mount, as ``ip netns add`` does (idempotent)."""
    os.makedirs(directory, exist_ok=True)
    target = directory.encode()
    if _libc.mount(b"none", target, None, _MS_SHARED | _MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        _check(-1, f"make {directory} shared")
    _check(_libc.mount(target, target, b"none", _MS_BIND | _MS_REC, None), f"bind {directory}")
    _check(
        _libc.mount(b"none", target, None, _MS_SHARED | _MS_REC, None),
        f"make {directory} shared",
    )


def _remove_netns(path: str) -> None:
    """Unmount and remove a named namespace; nothing if it does not exist."""
    for _ in range(8):  # a name mounted more than once unmounts one layer at a time
        if _libc.umount2(path.encode(), _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code in (errno.EINVAL, errno.ENOENT):
                break
            _check(-1, f"unmount {path}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _delete_link(ipr: Any, ifname: str) -> None:
    for index in ipr.link_lookup(ifname=ifname):
        try:
            ipr.link("del", index=index)
        except NetlinkError as exc:
            if exc.code not in _GONE:
                raise


def _one_index(ipr: Any, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NotFound(f"interface {ifname!r} does not exist")
    return int(found[0])


def _configure_actor_side(ipr: Any, plan: ActorNetworkPlan, *, replace: bool) -> None:
    """Inside the namespace: lo up, address on eth0, eth0 up, default route."""
    command = "replace" if replace else "add"
    lo = _one_index(ipr, "lo")
    ipr.link("set", index=lo, state="up")
    eth = _one_index(ipr, plan.actor_ifname)
    ipr.addr(command, index=eth, address=plan.actor_address, prefixlen=plan.prefix_len)
    ipr.link("set", index=eth, state="up")
    ipr.route(command, dst="0.0.0.0/0", gateway=plan.gateway_address, oif=eth)


def _build_inside(plan: ActorNetworkPlan) -> None:
    """Runs in a fresh thread: make the namespace, the veth pair and the actor side."""
    root_fd = os.open(_THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        _check(
            _libc.mount(_THREAD_NETNS, plan.netns_path.encode(), b"none", _MS_BIND, None),
            f"bind mount {plan.netns_path}",
        )
        with IPRoute() as ipr:  # opened inside the new namespace
            ipr.link(
                "add",
                ifname=plan.actor_ifname,
                kind="veth",
                address=plan.actor_mac,
                peer={
                    "ifname": plan.host_veth,
                    "address": plan.gateway_mac,
                    "net_ns_fd": root_fd,
                },
            )
            _disable_ipv6(plan.actor_ifname)
            _configure_actor_side(ipr, plan, replace=False)
    finally:
        os.close(root_fd)


def _reconfigure_inside(plan: ActorNetworkPlan) -> None:
    _enter_netns(plan.netns_path)
    with IPRoute() as ipr:
        _configure_actor_side(ipr, plan, replace=True)


def _check_prefix(prefix: str, what: str) -> None:
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise InvalidArgument(f"{what} must be a non-empty name prefix, got {prefix!r}")


class LinuxHostNetwork:
    """:class:`~substrate.net.ports.HostNetwork` on this machine (needs root).

    ``nftables`` loads the egress table (default: ``nft`` on the PATH); ``gateway``
    is the address the table redirects to (the plans' gateway address).
    """

    def __init__(
        self,
        *,
        nftables: Nftables | None = None,
        gateway: str = GATEWAY_ADDRESS,
        netns_dir: str = NETNS_DIR,
    ) -> None:
        self._nft = nftables or Nftables()
        self._gateway = gateway
        self._netns_dir = netns_dir

    # --- namespaces -------------------------------------------------------------------

    def _check_plan(self, plan: ActorNetworkPlan) -> None:
        if os.path.dirname(plan.netns_path) != self._netns_dir:
            raise InvalidArgument(f"namespace path {plan.netns_path!r} is not in {self._netns_dir}")

    def _destroy_sync(self, plan: ActorNetworkPlan) -> None:
        # The host veth first: deleting it deletes eth0 at once, whereas a veth left in
        # a deleted namespace is freed only when the kernel gets round to it.
        with IPRoute() as ipr:
            _delete_link(ipr, plan.host_veth)
        _remove_netns(plan.netns_path)

    def _create_sync(self, plan: ActorNetworkPlan) -> None:
        self._destroy_sync(plan)
        _ensure_shared_dir(self._netns_dir)
        os.close(os.open(plan.netns_path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
        try:
            _in_fresh_thread(lambda: _build_inside(plan))
            with IPRoute() as ipr:
                host = _one_index(ipr, plan.host_veth)
                _disable_ipv6(plan.host_veth)
                _loose_rp_filter(plan.host_veth)
                ipr.addr(
                    "add",
                    index=host,
                    address=plan.gateway_address,
                    prefixlen=plan.prefix_len,
                )
                ipr.link("set", index=host, state="up")
                ipr.neigh(
                    "replace",
                    dst=plan.actor_address,
                    lladdr=plan.actor_mac,
                    ifindex=host,
                    state="permanent",
                )
        except BaseException:
            with contextlib.suppress(Exception):
                self._destroy_sync(plan)
            raise

    async def create(self, plan: ActorNetworkPlan) -> None:
        """Create the namespace and veth pair afresh (whatever was there is removed)."""
        self._check_plan(plan)
        try:
            await anyio.to_thread.run_sync(self._create_sync, plan)
        except Exception as exc:
            raise _translate(exc, f"creating network {plan.netns}/{plan.host_veth}") from exc

    async def reconfigure(self, plan: ActorNetworkPlan) -> None:
        """Put eth0's address and the default route back (``replace``: idempotent)."""
        self._check_plan(plan)

        def run() -> None:
            if not _is_netns_mount(plan.netns_path):
                raise NotFound(f"network namespace {plan.netns!r} does not exist")
            _in_fresh_thread(lambda: _reconfigure_inside(plan))

        try:
            await anyio.to_thread.run_sync(run)
        except NotFound:
            raise
        except Exception as exc:
            raise _translate(exc, f"reconfiguring network {plan.netns}") from exc

    async def destroy(self, plan: ActorNetworkPlan) -> None:
        """Remove the host veth (and with it eth0) and the namespace; idempotent."""
        self._check_plan(plan)
        try:
            await anyio.to_thread.run_sync(self._destroy_sync, plan)
        except Exception as exc:
            raise _translate(exc, f"destroying network {plan.netns}/{plan.host_veth}") from exc

    async def exists(self, plan: ActorNetworkPlan) -> bool:
        self._check_plan(plan)
        return await anyio.to_thread.run_sync(_is_netns_mount, plan.netns_path)

    def _owned_sync(self, netns_prefix: str, veth_prefix: str) -> tuple[list[str], list[str]]:
        try:
            names = sorted(n for n in os.listdir(self._netns_dir) if n.startswith(netns_prefix))
        except FileNotFoundError:
            names = []
        with IPRoute() as ipr:
            veths = sorted(
                name
                for link in ipr.link("dump")
                if isinstance(name := link.get("ifname"), str) and name.startswith(veth_prefix)
            )
        return names, veths

    async def owned(self, netns_prefix: str, veth_prefix: str) -> tuple[list[str], list[str]]:
        """Sorted names of the namespaces and worker-side links with those prefixes."""
        _check_prefix(netns_prefix, "namespace prefix")
        _check_prefix(veth_prefix, "veth prefix")
        try:
            return await anyio.to_thread.run_sync(self._owned_sync, netns_prefix, veth_prefix)
        except Exception as exc:
            raise _translate(exc, "listing actor networks") from exc

    def _remove_owned_sync(self, netns_prefix: str, veth_prefix: str) -> None:
        names, veths = self._owned_sync(netns_prefix, veth_prefix)
        with IPRoute() as ipr:
            for veth in veths:
                _delete_link(ipr, veth)
        for name in names:
            _remove_netns(os.path.join(self._netns_dir, name))

    async def remove_owned(self, netns_prefix: str, veth_prefix: str) -> None:
        """Remove every namespace and worker-side link with those prefixes."""
        _check_prefix(netns_prefix, "namespace prefix")
        _check_prefix(veth_prefix, "veth prefix")
        try:
            await anyio.to_thread.run_sync(self._remove_owned_sync, netns_prefix, veth_prefix)
        except Exception as exc:
            raise _translate(exc, "removing actor networks") from exc

    # --- egress -------------------------------------------------------------------------

    async def set_egress(self, table: str, veth_prefix: str, ports: Mapping[str, int]) -> None:
        await self._nft.apply(render_egress_table(table, veth_prefix, self._gateway, ports))

    async def remove_egress(self, table: str) -> None:
        await self._nft.apply(render_delete_table(table))


__all__ = ["LinuxHostNetwork"]
