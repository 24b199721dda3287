"""The worker's egress proxy: every TCP connection an actor opens ends here.

The worker's egress table (:mod:`substrate.net.nft_ruleset`, installed through
:class:`~substrate.net.ports.HostNetwork`) redirects every new TCP connection that
arrives on an actor's host veth to that actor's own listener on the gateway address.
For each accepted connection the proxy reads the address the actor asked for
(``SO_ORIGINAL_DST``) and checks it against the actor's :class:`EgressPolicy`:

* denied (or not redirected at all): the connection is reset at once;
* allowed: the proxy connects to the destination — directly, or through the upstream
  HTTP proxy with ``CONNECT <ip>:<port>`` — and splices bytes both ways.

**Every connection the proxy closes is closed with RST** (``SO_LINGER {1, 0}``). runsc
cannot checkpoint a sandbox while any of its TCP endpoints is connected or in
TIME_WAIT, and a failed checkpoint kills it. When both directions have ended the proxy
first waits (at most ``drain_timeout``) until the actor has acknowledged every byte,
and forwards the upstream's end-of-stream to the actor as a FIN only while the actor has
not sent its own (so the actor is never the side that closes first and waits). Right
before a checkpoint the worker calls :meth:`EgressProxy.abort`, which resets every open
connection of the actor on both sides.

Listeners are bound to the actor's host veth (``SO_BINDTODEVICE``), not only to the
gateway address: every actor's veth carries the same gateway address, and without the
binding the kernel would route the SYN-ACK by destination alone — out of whichever veth
has the first route to the actor address. ``IP_FREEBIND`` lets the listener bind before
the veth has its address.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import socket
import struct
import termios
from collections.abc import Callable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Final, Self

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import structlog

from substrate.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from substrate.net.egress_policy import EgressPolicy, EgressUpstream
from substrate.net.nft_ruleset import check_ifname, check_table_name
from substrate.net.plan import GATEWAY_ADDRESS, PREFIX_LEN
from substrate.net.ports import HostNetwork
from substrate.services.listeners import accept_each, close_watched
from substrate.services.sandbox_sockets import set_rst_on_close

SO_ORIGINAL_DST: Final = 80
"""``getsockopt(SOL_IP, SO_ORIGINAL_DST)``: the destination before the NAT redirect."""
IP_FREEBIND: Final = getattr(socket, "IP_FREEBIND", 15)
CONNECT_TIMEOUT: Final = 10.0
DRAIN_TIMEOUT: Final = 2.0
BACKLOG: Final = 128
MAX_CONNECT_ANSWER: Final = 16384
"""The longest answer header the upstream proxy may send to a CONNECT."""
_CHUNK: Final = 65536
NOT_RUNNING: Final = "the egress proxy is not running"

OriginalDstLookup = Callable[[socket.socket], tuple[str, int] | None]
"""Reads where an accepted connection was going; ``None`` if it was not redirected."""

_log = structlog.get_logger(__name__)


def read_original_dst(sock: socket.socket) -> tuple[str, int] | None:
    """``SO_ORIGINAL_DST`` of an accepted socket.

    ``None`` for a connection that was not redirected when the host has no NAT rules; with
    NAT rules loaded, conntrack reports an unredirected connection's own destination (the
    listener), which the policy always refuses (it is inside the gateway's /30).
    """
    try:
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:  # ENOENT: no NAT entry, the connection was not redirected
        return None
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), int(port)


def _reset(sock: socket.socket | None) -> None:
    """Close ``sock`` with RST; nothing if it is already closed."""
    if sock is None or sock.fileno() == -1:
        return
    anyio.notify_closing(sock)
    with contextlib.suppress(OSError):
        set_rst_on_close(sock)
    sock.close()


def _unsent(sock: socket.socket) -> int:
    """Bytes in ``sock``'s send queue the peer has not acknowledged (``SIOCOUTQ``)."""
    buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int(struct.unpack("i", buf)[0])


async def _recv(sock: socket.socket) -> bytes:
    while True:
        try:
            return sock.recv(_CHUNK)
        except BlockingIOError:
            await anyio.wait_readable(sock)


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await anyio.wait_writable(sock)
            continue
        view = view[sent:]


class _UpstreamRefused(Exception):
    """The destination or the upstream proxy did not take the connection."""


@attrs.frozen(slots=True, kw_only=True)
class EgressStats:
    """Counters since the proxy was made."""

    accepted: int = 0
    """Connections the policy allowed (the proxy then tried to reach the destination)."""
    denied: int = 0
    """Connections reset because the policy denies them or they were not redirected."""
    aborted: int = 0
    """Open connections reset by :meth:`EgressProxy.abort` or ``close_actor``."""
    failed: int = 0
    """Allowed connections whose destination (or upstream proxy) could not be reached."""
    open: int = 0
    """Connections open now."""


@attrs.frozen(slots=True, kw_only=True)
class EgressConnection:
    """One open connection of an actor."""

    actor_uid: str
    client: tuple[str, int]
    """The actor's end (address, port)."""
    original_dst: tuple[str, int] | None
    """Where the actor was going (``None`` until read)."""


@attrs.define(eq=False)
class _Conn:
    actor_uid: str
    client: socket.socket
    client_address: tuple[str, int]
    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    upstream: socket.socket | None = None
    original_dst: tuple[str, int] | None = None
    actor_eof: bool = False
    broken: bool = False
    closed: bool = False

    def reset(self) -> None:
        self.closed = True
        _reset(self.client)
        _reset(self.upstream)


@attrs.define(eq=False)
class _Actor:
    uid: str
    host_veth: str
    ifindex: int
    port: int
    listener: socket.socket
    policy: EgressPolicy
    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    conns: set[_Conn] = attrs.Factory(set)


class EgressProxy:
    """The per-worker egress proxy; one listener per actor.

    ``network`` installs the worker's egress table ``table`` (veths named
    ``veth_prefix…``). ``policy`` is the default allow-list (an actor may have its own,
    given to :meth:`open_actor`); ``upstream`` (``host:port``) is the HTTP proxy to
    tunnel through, or ``None`` to connect directly. ``original_dst`` reads the
    redirected destination of an accepted socket (tests inject their own).
    ``bind_to_device`` binds each listener to its veth (turn it off only to test over
    loopback). Destinations in the actors' own link network (gateway/30) are always
    denied.

    Use ``async with proxy:`` (or ``await proxy.run()``): entering installs a table
    that drops everything from the worker's veths, leaving resets every connection,
    closes every listener and removes the table.
    """

    def __init__(
        self,
        network: HostNetwork,
        *,
        table: str,
        veth_prefix: str,
        policy: EgressPolicy | None = None,
        upstream: EgressUpstream | str | None = None,
        gateway: str = GATEWAY_ADDRESS,
        original_dst: OriginalDstLookup = read_original_dst,
        bind_to_device: bool = True,
        connect_timeout: float = CONNECT_TIMEOUT,
        drain_timeout: float = DRAIN_TIMEOUT,
        backlog: int = BACKLOG,
    ) -> None:
        self._network = network
        self._table = check_table_name(table)
        self._veth_prefix = check_ifname(veth_prefix, what="veth prefix", max_len=14)
        self._policy = policy if policy is not None else EgressPolicy.deny_all()
        self._upstream = EgressUpstream.parse(upstream) if isinstance(upstream, str) else upstream
        try:
            self._link_net = ipaddress.IPv4Network(f"{gateway}/{PREFIX_LEN}", strict=False)
        except ValueError:
            raise InvalidArgument(f"gateway {gateway!r} is not an IPv4 address") from None
        self._gateway = gateway
        self._original_dst = original_dst
        self._bind_to_device = bind_to_device
        self._connect_timeout = connect_timeout
        self._drain_timeout = drain_timeout
        self._backlog = backlog
        self._actors: dict[str, _Actor] = {}
        self._table_lock = anyio.Lock()
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._accepted = 0
        self._denied = 0
        self._aborted = 0
        self._failed = 0

    # --- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise FailedPrecondition("the egress proxy is already running")
        await self._network.set_egress(self._table, self._veth_prefix, {})
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, tg = self._stack, self._tg
        assert stack is not None
        assert tg is not None
        try:
            for actor in list(self._actors.values()):
                self._shut(actor)
            self._actors.clear()
            tg.cancel_scope.cancel()
            await stack.__aexit__(exc_type, exc, tb)
        finally:
            self._stack = self._tg = None
            with anyio.CancelScope(shield=True):
                await self._network.remove_egress(self._table)
        return None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled (``task_status.started()`` once the table is in)."""
        async with self:
            task_status.started()
            await anyio.sleep_forever()

    # --- actors -----------------------------------------------------------------------

    @property
    def stats(self) -> EgressStats:
        return EgressStats(
            accepted=self._accepted,
            denied=self._denied,
            aborted=self._aborted,
            failed=self._failed,
            open=sum(len(a.conns) for a in self._actors.values()),
        )

    def ports(self) -> dict[str, int]:
        """Host veth → listener port of every open actor (what the table redirects)."""
        return {a.host_veth: a.port for a in self._actors.values()}

    def port(self, actor_uid: str) -> int | None:
        actor = self._actors.get(actor_uid)
        return None if actor is None else actor.port

    def connections(self, actor_uid: str) -> tuple[EgressConnection, ...]:
        actor = self._actors.get(actor_uid)
        if actor is None:
            return ()
        return tuple(
            EgressConnection(
                actor_uid=actor_uid, client=c.client_address, original_dst=c.original_dst
            )
            for c in actor.conns
        )

    async def open_actor(
        self, actor_uid: str, host_veth: str, policy: EgressPolicy | None = None
    ) -> int:
        """Listen for ``actor_uid``'s connections from ``host_veth``; the listener's port.

        Idempotent: an open actor on the same veth keeps its listener (a new ``policy``
        replaces the old one); a veth that was re-created since (new interface index),
        or another veth, gets a new listener. ``NotFound`` if the veth does not exist,
        ``AlreadyExists`` if another actor has it.
        """
        if self._tg is None:
            raise Unavailable(NOT_RUNNING)
        if not isinstance(actor_uid, str) or not actor_uid:
            raise InvalidArgument("actor uid is required")
        check_ifname(host_veth, what="host veth name")
        if not host_veth.startswith(self._veth_prefix):
            raise InvalidArgument(
                f"host veth {host_veth!r} does not start with {self._veth_prefix!r}"
            )
        existing = self._actors.get(actor_uid)
        if existing is not None:
            if existing.host_veth == host_veth and self._same_device(existing):
                if policy is not None:
                    existing.policy = policy
                return existing.port
            await self.close_actor(actor_uid)
        holder = next((a for a in self._actors.values() if a.host_veth == host_veth), None)
        if holder is not None:
            raise AlreadyExists(f"host veth {host_veth!r} belongs to actor {holder.uid!r}")
        listener, ifindex = self._listen(host_veth)
        actor = _Actor(
            uid=actor_uid,
            host_veth=host_veth,
            ifindex=ifindex,
            port=int(listener.getsockname()[1]),
            listener=listener,
            policy=policy if policy is not None else self._policy,
        )
        self._actors[actor_uid] = actor
        self._tg.start_soon(self._serve, actor, name=f"egress {actor_uid}")
        try:
            await self._apply_table()
        except BaseException:
            if self._actors.get(actor_uid) is actor:
                del self._actors[actor_uid]
            self._shut(actor)
            raise
        _log.debug("egress actor open", actor=actor_uid, veth=host_veth, port=actor.port)
        return actor.port

    async def abort(self, actor_uid: str) -> int:
        """Reset (RST, both sides) every open connection of the actor; how many.

        Connections the kernel has completed but the proxy has not accepted yet are
        reset too. ``NotFound`` if the actor is not open.
        """
        actor = self._actors.get(actor_uid)
        if actor is None:
            raise NotFound(f"actor {actor_uid!r} has no egress listener")
        aborted = self._abort(actor)
        await anyio.lowlevel.checkpoint()
        return aborted

    async def close_actor(self, actor_uid: str) -> None:
        """Abort the actor's connections, close its listener, drop it from the table.

        Idempotent: an actor that is not open is nothing to close.
        """
        actor = self._actors.pop(actor_uid, None)
        if actor is None:
            return
        try:
            if self._tg is not None:
                await self._apply_table()
        finally:
            self._shut(actor)
        _log.debug("egress actor closed", actor=actor_uid)

    # --- internals --------------------------------------------------------------------

    def _same_device(self, actor: _Actor) -> bool:
        if not self._bind_to_device:
            return True
        try:
            return socket.if_nametoindex(actor.host_veth) == actor.ifindex
        except OSError:
            return False

    def _listen(self, host_veth: str) -> tuple[socket.socket, int]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
            ifindex = 0
            if self._bind_to_device:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, host_veth.encode())
                ifindex = socket.if_nametoindex(host_veth)
            sock.bind((self._gateway, 0))
            sock.listen(self._backlog)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.ENODEV, errno.ENXIO):
                raise NotFound(f"host veth {host_veth!r} does not exist") from exc
            if exc.errno in (errno.EPERM, errno.EACCES):
                raise Unavailable(
                    f"not permitted to listen on {host_veth!r} (needs CAP_NET_RAW): {exc}"
                ) from exc
            raise Internal(f"cannot listen on {self._gateway} at {host_veth!r}: {exc}") from exc
        return sock, ifindex

    async def _apply_table(self) -> None:
        async with self._table_lock:
            await self._network.set_egress(self._table, self._veth_prefix, self.ports())

    def _abort(self, actor: _Actor) -> int:
        conns = list(actor.conns)
        actor.conns.clear()
        for conn in conns:
            conn.scope.cancel()
            conn.reset()
        aborted = len(conns)
        while actor.listener.fileno() != -1:  # completed, not yet accepted
            try:
                sock, _ = actor.listener.accept()
            except OSError:
                break
            _reset(sock)
            aborted += 1
        self._aborted += aborted
        if aborted:
            _log.info("egress connections aborted", actor=actor.uid, count=aborted)
        return aborted

    def _shut(self, actor: _Actor) -> None:
        self._abort(actor)
        actor.scope.cancel()
        close_watched(actor.listener)

    async def _serve(self, actor: _Actor) -> None:
        with actor.scope:
            async with anyio.create_task_group() as tg:

                def accepted(sock: socket.socket, peer: Any) -> None:
                    try:
                        set_rst_on_close(sock)
                    except OSError:
                        _reset(sock)
                        return
                    conn = _Conn(actor_uid=actor.uid, client=sock, client_address=peer)
                    actor.conns.add(conn)
                    tg.start_soon(self._handle, actor, conn)

                await accept_each(
                    actor.listener, accepted, label=f"egress {actor.uid}", retry_after=0.1
                )

    def _allowed(self, actor: _Actor, dst: tuple[str, int]) -> bool:
        try:
            if ipaddress.IPv4Address(dst[0]) in self._link_net:
                return False
        except ValueError:
            return False
        return actor.policy.allows(*dst)

    async def _handle(self, actor: _Actor, conn: _Conn) -> None:
        try:
            with conn.scope:
                if conn.closed:
                    return
                try:
                    dst = self._original_dst(conn.client)
                except Exception as exc:
                    _log.warning("egress original destination unreadable", error=repr(exc))
                    dst = None
                conn.original_dst = dst
                if dst is None or not self._allowed(actor, dst):
                    self._denied += 1
                    _log.info("egress denied", actor=actor.uid, dst=dst)
                    return
                self._accepted += 1
                try:
                    with anyio.fail_after(self._connect_timeout):
                        leftover = await self._open_upstream(conn, dst)
                except (OSError, TimeoutError, _UpstreamRefused) as exc:
                    if not conn.closed:
                        self._failed += 1
                        _log.info("egress connect failed", actor=actor.uid, dst=dst, error=str(exc))
                    return
                if leftover:
                    await _send_all(conn.client, leftover)
                await self._splice(conn)
        except (OSError, anyio.ClosedResourceError):
            pass  # one side went away: both are reset below
        except Exception:  # one connection must never take the proxy down
            _log.exception("egress connection failed", actor=actor.uid)
        finally:
            conn.reset()
            actor.conns.discard(conn)

    async def _open_upstream(self, conn: _Conn, dst: tuple[str, int]) -> bytes:
        """Connect to ``dst`` (or through the upstream proxy); bytes already received."""
        if self._upstream is None:
            address: tuple[str, int] = dst
        else:
            infos = await anyio.getaddrinfo(
                self._upstream.host,
                self._upstream.port,
                family=socket.AF_INET,
                type=socket.SOCK_STREAM,
            )
            if not infos:
                raise _UpstreamRefused(f"{self._upstream} does not resolve")
            host, port = infos[0][4][:2]
            address = (str(host), int(port))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.upstream = sock
        sock.setblocking(False)
        set_rst_on_close(sock)
        code = sock.connect_ex(address)
        if code == errno.EINPROGRESS:
            await anyio.wait_writable(sock)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, f"connect {address[0]}:{address[1]}: {errno.errorcode.get(code)}")
        if self._upstream is None:
            return b""
        return await self._connect_through(sock, dst)

    async def _connect_through(self, sock: socket.socket, dst: tuple[str, int]) -> bytes:
        target = f"{dst[0]}:{dst[1]}"
        await _send_all(sock, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = await _recv(sock)
            if not chunk:
                raise _UpstreamRefused(f"{self._upstream} closed before answering CONNECT")
            answer += chunk
            if len(answer) > MAX_CONNECT_ANSWER:
                raise _UpstreamRefused(f"{self._upstream} sent an oversized CONNECT answer")
        head, _, rest = answer.partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise _UpstreamRefused(f"{self._upstream} answered CONNECT with {status_line!r}")
        if not 200 <= int(parts[1]) < 300:
            raise _UpstreamRefused(f"{self._upstream} refused CONNECT {target}: {status_line!r}")
        return rest

    async def _splice(self, conn: _Conn) -> None:
        upstream = conn.upstream
        assert upstream is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._pump, conn, conn.client, upstream, False, tg.cancel_scope)
            tg.start_soon(self._pump, conn, upstream, conn.client, True, tg.cancel_scope)
        if conn.broken or conn.closed:
            return
        # Both directions ended: let the actor acknowledge everything, then reset.
        with anyio.move_on_after(self._drain_timeout):
            # the kernel's send queue has no readiness event to wait for: poll it
            while conn.client.fileno() != -1 and _unsent(conn.client):  # noqa: ASYNC110
                await anyio.sleep(0.005)

    async def _pump(
        self,
        conn: _Conn,
        src: socket.socket,
        dst: socket.socket,
        toward_actor: bool,
        scope: anyio.CancelScope,
    ) -> None:
        try:
            while True:
                data = await _recv(src)
                if not data:
                    if toward_actor:
                        # Tell the actor the stream ended, unless it already closed its
                        # side: then it would wait in TIME_WAIT; it gets the RST instead.
                        if not conn.actor_eof:
                            dst.shutdown(socket.SHUT_WR)
                    else:
                        conn.actor_eof = True
                        dst.shutdown(socket.SHUT_WR)
                    return
                await _send_all(dst, data)
                await anyio.lowlevel.checkpoint()
        except (OSError, anyio.ClosedResourceError):
            conn.broken = True
            scope.cancel()


__all__ = [
    "SO_ORIGINAL_DST",
    "EgressConnection",
    "EgressProxy",
    "EgressStats",
    "OriginalDstLookup",
    "read_original_dst",
]
