"""A blocking wrapper of :class:`~substrate.client.AteClient` for scripts and REPLs.

It runs the async client on an event loop in a background thread (an anyio blocking portal
on asyncio, which grpclib requires); every method blocks until the call is done and raises
the same :mod:`substrate.errors` classes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial

from anyio.from_thread import BlockingPortal, start_blocking_portal

from substrate.client._async import DEFAULT_TIMEOUT, DEFAULT_TLS_NAME, AteClient
from substrate.core.ids import ActorRef, Labels, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorTemplate,
    Atespace,
    ResumeResult,
    SuspendMode,
    Tag,
    Worker,
)
from substrate.identity.spiffe import Identity, SpiffeId


class SyncAteClient:
    """The blocking twin of :class:`AteClient`; open it with :meth:`connect`."""

    def __init__(self, portal: BlockingPortal, client: AteClient) -> None:
        self._portal = portal
        self.client = client

    @classmethod
    @contextmanager
    def connect(
        cls,
        address: str,
        *,
        tls_dir: str | os.PathLike[str] | None = None,
        name: str = DEFAULT_TLS_NAME,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        ca: str | os.PathLike[str] | None = None,
        insecure: bool = False,
        timeout: float | None = DEFAULT_TIMEOUT,
        server_id: SpiffeId | Identity | str | None = None,
        pin_server: bool = True,
        check_hostname: bool = True,
    ) -> Iterator[SyncAteClient]:
        """Like :meth:`AteClient.connect`, blocking; the loop thread stops on exit."""
        with start_blocking_portal(backend="asyncio") as portal:
            connection = AteClient.connect(
                address,
                tls_dir=tls_dir,
                name=name,
                cert=cert,
                key=key,
                ca=ca,
                insecure=insecure,
                timeout=timeout,
                server_id=server_id,
                pin_server=pin_server,
                check_hostname=check_hostname,
            )
            with portal.wrap_async_context_manager(connection) as client:
                yield cls(portal, client)

    # --- atespaces --------------------------------------------------------------------

    def create_atespace(self, name: str) -> Atespace:
        return self._portal.call(self.client.create_atespace, name)

    def get_atespace(self, name: str) -> Atespace:
        return self._portal.call(self.client.get_atespace, name)

    def list_atespaces(self) -> list[Atespace]:
        return self._portal.call(self.client.list_atespaces)

    def delete_atespace(self, name: str) -> None:
        self._portal.call(self.client.delete_atespace, name)

    # --- templates --------------------------------------------------------------------

    def create_template(self, template: ActorTemplate) -> ActorTemplate:
        return self._portal.call(self.client.create_template, template)

    def get_template(self, ref: TemplateRef | str) -> ActorTemplate:
        return self._portal.call(self.client.get_template, ref)

    def list_templates(self, atespace: str) -> list[ActorTemplate]:
        return self._portal.call(self.client.list_templates, atespace)

    def update_template(self, template: ActorTemplate) -> ActorTemplate:
        return self._portal.call(self.client.update_template, template)

    def delete_template(self, ref: TemplateRef | str) -> None:
        self._portal.call(self.client.delete_template, ref)

    # --- actors -----------------------------------------------------------------------

    def create_actor(
        self,
        ref: ActorRef | str,
        *,
        template: TemplateRef | str | None = None,
        source_tag: TagRef | str | None = None,
        worker_selector: Labels | Mapping[str, str] | None = None,
    ) -> Actor:
        return self._portal.call(
            partial(
                self.client.create_actor,
                ref,
                template=template,
                source_tag=source_tag,
                worker_selector=worker_selector,
            )
        )

    def get_actor(self, ref: ActorRef | str) -> Actor:
        return self._portal.call(self.client.get_actor, ref)

    def list_actors_page(
        self, atespace: str | None = None, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Actor], str]:
        return self._portal.call(
            partial(
                self.client.list_actors_page,
                atespace,
                page_size=page_size,
                page_token=page_token,
            )
        )

    def list_actors(self, atespace: str | None = None, *, page_size: int = 0) -> Iterator[Actor]:
        """Every actor, fetched a page at a time as the iteration proceeds."""
        token = ""
        while True:
            actors, token = self.list_actors_page(atespace, page_size=page_size, page_token=token)
            yield from actors
            if not token:
                return

    def update_actor_selector(
        self, ref: ActorRef | str, worker_selector: Labels | Mapping[str, str] | None
    ) -> Actor:
        return self._portal.call(self.client.update_actor_selector, ref, worker_selector)

    def suspend_actor(self, ref: ActorRef | str, mode: SuspendMode = SuspendMode.ASYNC) -> Actor:
        return self._portal.call(self.client.suspend_actor, ref, mode)

    def pause_actor(self, ref: ActorRef | str) -> Actor:
        return self._portal.call(self.client.pause_actor, ref)

    def resume_actor(self, ref: ActorRef | str) -> ResumeResult:
        return self._portal.call(self.client.resume_actor, ref)

    def revert_actor(self, ref: ActorRef | str) -> Actor:
        return self._portal.call(self.client.revert_actor, ref)

    def delete_actor(self, ref: ActorRef | str, *, force: bool = False) -> None:
        self._portal.call(partial(self.client.delete_actor, ref, force=force))

    # --- tags -------------------------------------------------------------------------

    def create_tag(self, ref: TagRef | str, actor: ActorRef | str) -> Tag:
        return self._portal.call(self.client.create_tag, ref, actor)

    def get_tag(self, ref: TagRef | str) -> Tag:
        return self._portal.call(self.client.get_tag, ref)

    def list_tags(self, atespace: str) -> list[Tag]:
        return self._portal.call(self.client.list_tags, atespace)

    def delete_tag(self, ref: TagRef | str) -> None:
        self._portal.call(self.client.delete_tag, ref)

    # --- workers ----------------------------------------------------------------------

    def list_workers(self, pool: str | None = None) -> list[Worker]:
        return self._portal.call(self.client.list_workers, pool)

    def get_worker(self, name: WorkerRef | str) -> Worker:
        return self._portal.call(self.client.get_worker, name)

    def drain_worker(self, name: WorkerRef | str) -> Worker:
        return self._portal.call(self.client.drain_worker, name)


__all__ = ["SyncAteClient"]
