"""TLS contexts over a loopback socket, and reading the peer's SPIFFE id."""

from __future__ import annotations

import asyncio
import ssl
from datetime import UTC, datetime
from pathlib import Path

import attrs
import pytest

from substrate.errors import Unauthenticated
from substrate.identity import (
    CertificateAuthority,
    Identity,
    TlsFiles,
    check_peer,
    client_context,
    peer_identity,
    peer_spiffe_id,
    server_context,
    write_bundle,
)
from substrate.identity.spiffe import SpiffeId

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    now = datetime.now(UTC)
    base = Path(tmp_path_factory.mktemp("tls"))
    ca = CertificateAuthority.create("ate", now=now)
    other = CertificateAuthority.create("ate", now=now)
    return {
        "server": write_bundle(base / "ours", "ateapi", ca.issue(Identity.ateapi(), now=now)),
        "client": write_bundle(base / "ours", "alice", ca.issue(Identity.client("alice"), now=now)),
        "foreign": write_bundle(
            base / "theirs", "mallory", other.issue(Identity.client("mallory"), now=now)
        ),
    }


def test_contexts_are_strict(creds: dict[str, TlsFiles]) -> None:
    server = server_context(creds["server"])
    assert server.verify_mode is ssl.CERT_REQUIRED
    assert server.minimum_version is ssl.TLSVersion.TLSv1_2
    client = client_context(creds["client"])
    assert client.verify_mode is ssl.CERT_REQUIRED
    assert client.check_hostname
    assert not client_context(creds["client"], check_hostname=False).check_hostname
    # Only our CA is trusted (no system roots).
    assert [c["subject"] for c in server.get_ca_certs()] == [
        c["subject"] for c in client.get_ca_certs()
    ]
    assert len(server.get_ca_certs()) == 1


@attrs.frozen
class Session:
    reply: bytes
    """What the client read: b"ok" from a served session, b"" when the server hung up."""
    served: bool
    """Whether the server accepted the session (its handler ran)."""
    client_cert: dict[str, object] | None
    server_side: ssl.SSLObject | None
    """The client's SSL object (it holds the server's certificate)."""


async def _handshake(server_files: TlsFiles, client_files: TlsFiles) -> Session:
    """Connect once and read what the server answers."""
    seen: list[dict[str, object] | None] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        obj = writer.get_extra_info("ssl_object")
        seen.append(obj.getpeercert() if obj else None)
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server_context(server_files))
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(client_files), server_hostname="127.0.0.1"
        )
        try:
            reply = await asyncio.wait_for(reader.read(2), 5)
            obj = writer.get_extra_info("ssl_object")
        finally:
            writer.close()
        return Session(
            reply=reply,
            served=bool(seen),
            client_cert=seen[0] if seen else None,
            server_side=obj,
        )
    finally:
        server.close()
        await server.wait_closed()


async def test_mutual_handshake_reveals_both_identities(creds: dict[str, TlsFiles]) -> None:
    session = await _handshake(creds["server"], creds["client"])
    assert session.reply == b"ok"
    assert session.served
    assert peer_identity(session.client_cert, trust_domain="ate") == Identity.client("alice")
    assert session.server_side is not None
    assert session.server_side.selected_alpn_protocol() == "h2"
    assert check_peer(session.server_side, Identity.ateapi()) == Identity.ateapi().spiffe_id
    with pytest.raises(Unauthenticated, match="expected spiffe://ate/router"):
        check_peer(session.server_side, Identity.router())


async def test_client_from_another_ca_is_dropped_without_a_session(
    creds: dict[str, TlsFiles],
) -> None:
    # With TLS 1.3 the client's side of the handshake completes before the server checks
    # the client certificate; the server then drops the connection: the client reads EOF.
    foreign = creds["foreign"]
    trusting_us = TlsFiles(cert=foreign.cert, key=foreign.key, ca=creds["server"].ca)
    session = await _handshake(creds["server"], trusting_us)
    assert session.reply == b""
    assert not session.served


async def test_client_refuses_a_server_from_another_ca(creds: dict[str, TlsFiles]) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(creds["server"], creds["foreign"])


URI = "URI"


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        (None, "no verified certificate"),
        ({}, "no verified certificate"),
        ({"subjectAltName": (("DNS", "localhost"),)}, "found 0"),
        (
            {"subjectAltName": ((URI, "spiffe://ate/router"), (URI, "spiffe://ate/ateapi"))},
            "found 2",
        ),
        ({"subjectAltName": ((URI, "spiffe://ate/a b"),)}, "malformed"),
    ],
)
def test_peer_without_one_valid_spiffe_id_is_unauthenticated(
    peer: dict[str, object] | None, message: str
) -> None:
    with pytest.raises(Unauthenticated, match=message):
        peer_spiffe_id(peer)


def test_peer_identity_needs_a_known_kind_in_our_trust_domain() -> None:
    def cert(uri: str) -> dict[str, object]:
        return {"subjectAltName": ((URI, uri), ("DNS", "localhost"), ("URI", "https://x"))}

    assert peer_spiffe_id(cert("spiffe://ate/router")) == SpiffeId("ate", "/router")
    assert peer_identity(cert("spiffe://ate/atelet/n1"), trust_domain="ate") == Identity.atelet(
        "n1"
    )
    with pytest.raises(Unauthenticated, match="trust domain"):
        peer_identity(cert("spiffe://other/router"), trust_domain="ate")
    with pytest.raises(Unauthenticated, match="no known kind"):
        peer_identity(cert("spiffe://ate/admin"), trust_domain="ate")
