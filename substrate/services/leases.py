"""A held lease as an async context manager: acquire, renew in the background, release."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import structlog
from anyio.abc import TaskGroup

from substrate.core.ports import Lease, Store
from substrate.errors import Aborted, SubstrateError

log = structlog.get_logger("substrate.lease")


@asynccontextmanager
async def held_lease(
    store: Store, key: str, *, ttl: float, task_group: TaskGroup
) -> AsyncIterator[Lease]:
    """Hold ``key`` for the body of the ``async with``.

    Raises :class:`~substrate.errors.LeaseHeld` (Aborted) if someone else holds it. While the
    body runs, a task in ``task_group`` renews the lease every ``ttl / 3``; if renewal keeps
    failing until a third of the TTL is left, the body is cancelled and the ``async with``
    raises :class:`~substrate.errors.Aborted`, so work guarded by the lease never outlives
    it. The lease is released on exit, also when the body fails or is cancelled.
    """
    lease = await store.acquire_lease(key, ttl=ttl)
    current = [lease]
    lost = [False]
    body = anyio.CancelScope()
    renewing = anyio.CancelScope()

    async def renew() -> None:
        with renewing:
            deadline = anyio.current_time() + ttl
            while True:
                await anyio.sleep(ttl / 3)
                try:
                    current[0] = await store.renew_lease(current[0], ttl=ttl)
                    deadline = anyio.current_time() + ttl
                except SubstrateError as exc:
                    log.warning("lease renewal failed", key=key, error=str(exc))
                    if anyio.current_time() > deadline - ttl / 3:
                        lost[0] = True
                        body.cancel()
                        return

    task_group.start_soon(renew)
    try:
        with body:
            yield lease
    finally:
        renewing.cancel()
        with anyio.CancelScope(shield=True):
            try:
                await store.release_lease(current[0])
            except SubstrateError as exc:
                # An unreleased lease expires by itself after its TTL.
                log.warning("lease release failed", key=key, error=str(exc))
    if lost[0]:
        raise Aborted(f"lost the lease {key} while the operation ran")


__all__ = ["held_lease"]
