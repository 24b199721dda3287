"""Identity and mutual TLS: SPIFFE ids, a small CA, credential files, ``ssl`` contexts.

* :mod:`.spiffe` (pure): :class:`SpiffeId` and :class:`Identity` (ateapi, router,
  atelet/<node>, worker/<uid>, client/<name>) with strict parsing.
* :mod:`.ca` (in memory): :class:`CertificateAuthority` issues EC P-256 leaf certificates
  whose URI SAN is the identity's SPIFFE id.
* :mod:`.files` (file I/O): :func:`write_bundle`, :func:`write_ca`, :func:`load_ca`.
* :mod:`.tls`: server and client ``ssl.SSLContext`` builders and the peer's identity.
"""

from substrate.identity.ca import CertificateAuthority, IssuedCert
from substrate.identity.files import TlsFiles, load_ca, write_bundle, write_ca
from substrate.identity.spiffe import DEFAULT_TRUST_DOMAIN, Identity, IdentityKind, SpiffeId
from substrate.identity.tls import (
    check_peer,
    client_context,
    peer_identity,
    peer_spiffe_id,
    server_context,
)

__all__ = [
    "DEFAULT_TRUST_DOMAIN",
    "CertificateAuthority",
    "Identity",
    "IdentityKind",
    "IssuedCert",
    "SpiffeId",
    "TlsFiles",
    "check_peer",
    "client_context",
    "load_ca",
    "peer_identity",
    "peer_spiffe_id",
    "server_context",
    "write_bundle",
    "write_ca",
]
