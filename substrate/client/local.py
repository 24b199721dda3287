"""The local stack ``ate up`` starts, as the SDK sees it: its state file and a client of it.

``ate up`` writes ``<state-dir>/stack.json`` (:data:`STATE_FILE`) naming the endpoints
(ateapi's gRPC address, the router's URL, the admin pages), the runtime, the stores, the
nodes with their directories and workers, and the processes it started. The client
credentials are in ``<state-dir>/tls/client/`` (``client.crt``, ``client.key``,
``ca.crt``).

.. code-block:: python

    async with connect_local("~/.local/state/ate") as ate:
        print(await ate.list_workers())

    stack = read_local_stack("~/.local/state/ate")
    answer = await call_actor(stack.router_url, "demo/counter-1")

:func:`default_state_dir` is where the ``ate`` CLI keeps that directory unless told
otherwise; it takes the environment as an argument (library code reads none).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Final

import attrs

from substrate.client._async import DEFAULT_TIMEOUT, AteClient
from substrate.client._sync import SyncAteClient
from substrate.errors import InvalidArgument, NotFound
from substrate.identity.spiffe import Identity

STATE_FILE: Final = "stack.json"
STATE_FORMAT: Final = "ate-local-stack/1"
CLIENT_TLS_NAME: Final = "client"
STATE_DIR_ENV: Final = "ATE_STATE_DIR"


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """``$ATE_STATE_DIR``, else ``$XDG_STATE_HOME/ate``, else ``~/.local/state/ate``."""
    if environ.get(STATE_DIR_ENV):
        return Path(environ[STATE_DIR_ENV]).expanduser().absolute()
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]).expanduser().absolute() / "ate"
    home = environ.get("HOME") or str(Path("~").expanduser())
    return Path(home).absolute() / ".local" / "state" / "ate"


@attrs.frozen(slots=True, kw_only=True)
class ProcessRecord:
    """One daemon process of the stack."""

    name: str
    """``ateapi``, ``router``, ``atelet-<node>`` or ``worker-<name>``."""
    pid: int
    start_ticks: int
    """``/proc/<pid>/stat``'s start time: with the pid, it names one process."""
    log: str
    argv: tuple[str, ...] = ()


@attrs.frozen(slots=True, kw_only=True)
class NodeRecord:
    name: str
    directory: str
    workers: tuple[str, ...] = ()


@attrs.frozen(slots=True, kw_only=True)
class LocalStack:
    """What ``<state-dir>/stack.json`` says about a local stack."""

    state_dir: Path
    ateapi_address: str
    ateapi_admin: str
    router_url: str
    router_admin: str
    trust_domain: str
    runtime: str
    """``gvisor`` or ``fake``."""
    store: str
    objects: str
    nodes: tuple[NodeRecord, ...] = ()
    processes: tuple[ProcessRecord, ...] = ()
    started_at: float = 0.0
    note: str = ""
    """Why the runtime is what it is, when it is not what was asked for."""

    @property
    def tls_dir(self) -> Path:
        """The client's credentials (``client.crt``, ``client.key``, ``ca.crt``)."""
        return self.state_dir / "tls" / CLIENT_TLS_NAME

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(w for n in self.nodes for w in n.workers)

    @property
    def store_redacted(self) -> str:
        return redact_url(self.store)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "stateDir": str(self.state_dir),
            "ateapiAddress": self.ateapi_address,
            "ateapiAdmin": self.ateapi_admin,
            "routerUrl": self.router_url,
            "routerAdmin": self.router_admin,
            "trustDomain": self.trust_domain,
            "runtime": self.runtime,
            "store": self.store,
            "objects": self.objects,
            "nodes": [
                {"name": n.name, "directory": n.directory, "workers": list(n.workers)}
                for n in self.nodes
            ],
            "processes": [
                {
                    "name": p.name,
                    "pid": p.pid,
                    "startTicks": p.start_ticks,
                    "log": p.log,
                    "argv": list(p.argv),
                }
                for p in self.processes
            ],
            "startedAt": self.started_at,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: object, *, state_dir: Path) -> LocalStack:
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise InvalidArgument(f"{state_dir / STATE_FILE} is not a {STATE_FORMAT} file")
        try:
            return cls(
                state_dir=state_dir,
                ateapi_address=str(data["ateapiAddress"]),
                ateapi_admin=str(data["ateapiAdmin"]),
                router_url=str(data["routerUrl"]),
                router_admin=str(data["routerAdmin"]),
                trust_domain=str(data["trustDomain"]),
                runtime=str(data["runtime"]),
                store=str(data["store"]),
                objects=str(data["objects"]),
                nodes=tuple(
                    NodeRecord(
                        name=str(n["name"]),
                        directory=str(n["directory"]),
                        workers=tuple(str(w) for w in n["workers"]),
                    )
                    for n in data["nodes"]
                ),
                processes=tuple(
                    ProcessRecord(
                        name=str(p["name"]),
                        pid=int(p["pid"]),
                        start_ticks=int(p["startTicks"]),
                        log=str(p["log"]),
                        argv=tuple(str(a) for a in p.get("argv", [])),
                    )
                    for p in data["processes"]
                ),
                started_at=float(data.get("startedAt", 0.0)),
                note=str(data.get("note", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"{state_dir / STATE_FILE} is malformed: {exc!r}") from None


def redact_url(url: str) -> str:
    """``postgresql://user:secret@host/db`` → ``postgresql://***@host/db``."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def state_file(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir).expanduser() / STATE_FILE


def read_local_stack(state_dir: str | os.PathLike[str]) -> LocalStack:
    """The stack recorded in ``state_dir``; :class:`NotFound` if no ``ate up`` wrote one."""
    directory = Path(state_dir).expanduser().absolute()
    path = directory / STATE_FILE
    try:
        raw = path.read_text()
    except FileNotFoundError:
        raise NotFound(f"no local stack in {directory} (start one with `ate up`)") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc}") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(f"{path} is not valid JSON: {exc}") from None
    return LocalStack.from_json(data, state_dir=directory)


@asynccontextmanager
async def connect_local(
    state_dir: str | os.PathLike[str],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 (each call's timeout)
) -> AsyncIterator[AteClient]:
    """An :class:`AteClient` of the local stack in ``state_dir`` (mTLS, ateapi pinned)."""
    stack = read_local_stack(state_dir)
    async with AteClient.connect(
        stack.ateapi_address,
        tls_dir=stack.tls_dir,
        name=CLIENT_TLS_NAME,
        timeout=timeout,
        server_id=Identity.ateapi(stack.trust_domain),
    ) as client:
        yield client


@contextmanager
def connect_local_sync(
    state_dir: str | os.PathLike[str], *, timeout: float | None = DEFAULT_TIMEOUT
) -> Iterator[SyncAteClient]:
    """The blocking twin of :func:`connect_local`."""
    stack = read_local_stack(state_dir)
    with SyncAteClient.connect(
        stack.ateapi_address,
        tls_dir=stack.tls_dir,
        name=CLIENT_TLS_NAME,
        timeout=timeout,
        server_id=Identity.ateapi(stack.trust_domain),
    ) as client:
        yield client


__all__ = [
    "CLIENT_TLS_NAME",
    "STATE_DIR_ENV",
    "STATE_FILE",
    "LocalStack",
    "NodeRecord",
    "ProcessRecord",
    "connect_local",
    "connect_local_sync",
    "default_state_dir",
    "read_local_stack",
    "redact_url",
    "state_file",
]
