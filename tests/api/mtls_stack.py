"""A real ateapi gRPC server over mTLS for the API tests: a CA, credentials, a cluster.

``pki(tmp)`` issues one bundle per identity the tests use (and a client bundle from a
second, untrusted CA); ``api_stack(pki)`` runs the harness cluster behind
:func:`substrate.api.server.serving` on 127.0.0.1 (free port) and yields both.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import attrs
from grpclib.client import Channel

from substrate.api.server import Serving, serving
from substrate.client import AteClient, parse_address
from substrate.client._async import _close_channel as close_channel
from substrate.identity import (
    CertificateAuthority,
    Identity,
    TlsFiles,
    client_context,
    server_context,
    write_bundle,
)
from substrate.identity.ca import CA_VALIDITY
from tests.services.harness import Cluster, cluster

NOW = datetime.now(UTC)
TRUST_DOMAIN = "ate"

IDENTITIES: dict[str, Identity] = {
    "ateapi": Identity.ateapi(TRUST_DOMAIN),
    "client": Identity.client("alice", TRUST_DOMAIN),
    "router": Identity.router(TRUST_DOMAIN),
    "atelet-0": Identity.atelet("node-0", TRUST_DOMAIN),
    "atelet-1": Identity.atelet("node-1", TRUST_DOMAIN),
    "worker": Identity.worker("w-0-0", TRUST_DOMAIN),
}


@attrs.frozen
class Pki:
    ca: CertificateAuthority
    dir: Path
    foreign_dir: Path
    """Holds ``client.crt``/``client.key`` from another CA, *our* ``ca.crt``, and the other
    CA's certificate as ``other-ca.crt``."""

    def files(self, name: str) -> TlsFiles:
        return TlsFiles.in_dir(self.dir, name)


def make_pki(tmp: Path) -> Pki:
    ca = CertificateAuthority.create(TRUST_DOMAIN, now=NOW)
    base = tmp / "tls"
    for name, identity in IDENTITIES.items():
        write_bundle(base, name, ca.issue(identity, now=NOW, valid_for=CA_VALIDITY))
    other = CertificateAuthority.create(TRUST_DOMAIN, now=NOW)
    foreign = tmp / "foreign"
    issued = other.issue(IDENTITIES["client"], now=NOW, valid_for=CA_VALIDITY)
    write_bundle(foreign, "client", attrs.evolve(issued, ca_pem=ca.cert_pem))
    (foreign / "other-ca.crt").write_bytes(other.cert_pem)
    return Pki(ca=ca, dir=base, foreign_dir=foreign)


@attrs.frozen
class Stack:
    cluster: Cluster
    serving: Serving
    pki: Pki

    @property
    def address(self) -> str:
        return self.serving.address

    def connect(
        self, name: str = "client", *, timeout: float = 10.0
    ) -> AbstractAsyncContextManager[AteClient]:
        return AteClient.connect(self.address, tls_dir=self.pki.dir, name=name, timeout=timeout)


@asynccontextmanager
async def api_stack(
    pki: Pki, *, insecure: bool = False, trust_domain: str = TRUST_DOMAIN
) -> AsyncIterator[Stack]:
    """The harness cluster served over mTLS (or plaintext with ``insecure``)."""
    ctx = None if insecure else server_context(pki.files("ateapi"))
    async with (
        cluster() as c,
        serving(
            c.svc, "127.0.0.1", 0, ssl=ctx, insecure=insecure, trust_domain=trust_domain
        ) as srv,
    ):
        yield Stack(cluster=c, serving=srv, pki=pki)


@asynccontextmanager
async def raw_channel(
    address: str, files: TlsFiles | None, *, context: ssl.SSLContext | None = None
) -> AsyncIterator[Channel]:
    """A bare grpclib channel (for the registry and raw requests): mTLS with ``files``,
    an explicit ``context``, or plaintext when both are None."""
    host, port = parse_address(address)
    ctx = context if context is not None else (client_context(files) if files else None)
    channel = Channel(host, port, ssl=ctx)
    try:
        yield channel
    finally:
        await close_channel(channel)
