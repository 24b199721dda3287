"""``ssl`` contexts for substrate's mutual TLS, and the peer's SPIFFE id after a handshake.

* :func:`server_context`: requires a client certificate signed by our CA (and only our CA:
  no system roots), TLS 1.2 or newer, ALPN ``h2`` for gRPC.
* :func:`client_context`: verifies the server against our CA (hostname checked by
  default: the certificates carry ``localhost``/loopback SANs), presents our certificate.
* :func:`peer_spiffe_id` / :func:`peer_identity`: the SPIFFE id of a verified peer, from an
  ``SSLObject`` or a ``getpeercert()`` dict; :func:`check_peer` pins an expected id.

Building a context reads the PEM files (``ssl`` loads certificates only from files); the
peer helpers are pure.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Final

from substrate.errors import InvalidArgument, Unauthenticated
from substrate.identity.files import TlsFiles
from substrate.identity.spiffe import Identity, SpiffeId

ALPN_PROTOCOLS: Final = ("h2",)
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
CIPHERS_TLS12: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""TLS 1.2 suites (forward secret AEAD only, as HTTP/2 requires); TLS 1.3 uses its defaults."""


def _harden(ctx: ssl.SSLContext, files: TlsFiles) -> ssl.SSLContext:
    ctx.minimum_version = MINIMUM_VERSION
    ctx.set_ciphers(CIPHERS_TLS12)
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_verify_locations(cafile=str(files.ca))
    ctx.load_cert_chain(certfile=str(files.cert), keyfile=str(files.key))
    ctx.set_alpn_protocols(list(ALPN_PROTOCOLS))
    return ctx


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context that requires a client certificate issued by our CA."""
    return _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), files)


def client_context(files: TlsFiles, *, check_hostname: bool = True) -> ssl.SSLContext:
    """A client context that trusts only our CA and presents our certificate.

    With ``check_hostname=False`` the server is still verified against our CA; pin its
    SPIFFE id with :func:`check_peer` instead of its host name.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = check_hostname
    return _harden(ctx, files)


PeerCert = Mapping[str, Any]
"""What ``SSLObject.getpeercert()`` returns for a verified peer."""


def _uri_sans(peercert: PeerCert) -> list[str]:
    sans = peercert.get("subjectAltName", ())
    return [str(value) for kind, value in sans if kind == "URI"]


def peer_spiffe_id(peer: PeerCert | ssl.SSLObject | ssl.SSLSocket | None) -> SpiffeId:
    """The SPIFFE id of a verified peer; :class:`Unauthenticated` if it has none (or many)."""
    cert = peer.getpeercert() if isinstance(peer, ssl.SSLObject | ssl.SSLSocket) else peer
    if not cert:
        raise Unauthenticated("the peer presented no verified certificate")
    uris = [u for u in _uri_sans(cert) if u.startswith("spiffe://")]
    if len(uris) != 1:
        raise Unauthenticated(
            f"the peer certificate must carry exactly one SPIFFE id (found {len(uris)})"
        )
    try:
        return SpiffeId.parse(uris[0])
    except InvalidArgument as exc:
        raise Unauthenticated(f"the peer's SPIFFE id is malformed: {exc.description}") from None


def peer_identity(
    peer: PeerCert | ssl.SSLObject | ssl.SSLSocket | None, *, trust_domain: str
) -> Identity:
    """The substrate identity of a verified peer in ``trust_domain`` (else Unauthenticated)."""
    spiffe_id = peer_spiffe_id(peer)
    try:
        return Identity.from_spiffe_id(spiffe_id, trust_domain=trust_domain)
    except InvalidArgument as exc:
        raise Unauthenticated(f"unrecognised peer identity: {exc.description}") from None


def check_peer(
    peer: PeerCert | ssl.SSLObject | ssl.SSLSocket | None, expected: SpiffeId | Identity
) -> SpiffeId:
    """Pin the peer's SPIFFE id to ``expected``; :class:`Unauthenticated` on a mismatch."""
    want = expected.spiffe_id if isinstance(expected, Identity) else expected
    got = peer_spiffe_id(peer)
    if got != want:
        raise Unauthenticated(f"the peer is {got}, expected {want}")
    return got


__all__ = [
    "ALPN_PROTOCOLS",
    "CIPHERS_TLS12",
    "MINIMUM_VERSION",
    "PeerCert",
    "check_peer",
    "client_context",
    "peer_identity",
    "peer_spiffe_id",
    "server_context",
]
