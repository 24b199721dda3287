"""A small certificate authority for substrate's mTLS (in memory; no file I/O here).

:meth:`CertificateAuthority.create` makes a self-signed EC P-256 CA whose certificate
carries the trust domain's SPIFFE id (``spiffe://<trust-domain>``) as its URI SAN;
:meth:`CertificateAuthority.issue` signs X509-SVID-style leaf certificates: exactly one URI
SAN (the identity's SPIFFE id), plus DNS and IP SANs so that ordinary TLS hostname checks
pass (``localhost``, ``127.0.0.1`` and ``::1`` by default). Leaves may act as TLS server and
client. Times are arguments (``now``): this module never reads the clock.

Writing the PEM files is :mod:`substrate.identity.files`' job.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Final

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from substrate.errors import InvalidArgument
from substrate.identity.spiffe import DEFAULT_TRUST_DOMAIN, Identity, SpiffeId

CA_VALIDITY: Final = timedelta(days=3650)
LEAF_VALIDITY: Final = timedelta(days=365)
CLOCK_SKEW: Final = timedelta(minutes=5)
"""Certificates are valid from ``now - CLOCK_SKEW`` to tolerate slightly late clocks."""
DEFAULT_DNS_NAMES: Final = ("localhost",)
DEFAULT_IP_ADDRESSES: Final = ("127.0.0.1", "::1")
_ORGANIZATION: Final = "substrate"

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _aware(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise InvalidArgument("certificate times must be timezone-aware datetimes")
    return now.astimezone(UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _ip(value: str | IpAddress) -> IpAddress:
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return value
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise InvalidArgument(f"{value!r} is not an IP address") from None


def _dns(value: str) -> str:
    if not value or any(c.isspace() for c in value) or not value.isascii():
        raise InvalidArgument(f"{value!r} is not a DNS name")
    return value


@attrs.frozen(slots=True)
class IssuedCert:
    """A leaf certificate, its private key and the CA certificate that signed it (PEM)."""

    identity: Identity
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    not_after: datetime

    @property
    def spiffe_id(self) -> SpiffeId:
        return self.identity.spiffe_id

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def spiffe_ids_of(cert: x509.Certificate) -> tuple[str, ...]:
    """The ``spiffe://`` URI SANs of ``cert`` (raw strings, not validated)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    return tuple(u for u in uris if u.startswith("spiffe://"))


class CertificateAuthority:
    """An EC P-256 CA for one trust domain."""

    def __init__(self, *, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        if certificate.public_key() != key.public_key():
            raise InvalidArgument("the CA key does not match the CA certificate")
        ids = spiffe_ids_of(certificate)
        if len(ids) != 1:
            raise InvalidArgument("the CA certificate must carry exactly one spiffe:// URI SAN")
        spiffe_id = SpiffeId.parse(ids[0])
        if spiffe_id.path:
            raise InvalidArgument(f"the CA's SPIFFE id {spiffe_id} must name a trust domain")
        self.certificate = certificate
        self.key = key
        self.trust_domain = spiffe_id.trust_domain

    @classmethod
    def create(
        cls,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
        *,
        now: datetime,
        valid_for: timedelta = CA_VALIDITY,
        common_name: str | None = None,
    ) -> CertificateAuthority:
        """A new self-signed CA for ``trust_domain``, valid from ``now`` for ``valid_for``."""
        spiffe_id = SpiffeId(trust_domain=trust_domain)
        now = _aware(now)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
                x509.NameAttribute(
                    NameOID.COMMON_NAME, common_name or f"substrate CA {trust_domain}"
                ),
            ]
        )
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + valid_for)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(spiffe_id))]),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(certificate=certificate, key=key)

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        """Load a CA written by :func:`substrate.identity.files.write_ca`."""
        try:
            certificate = x509.load_pem_x509_certificate(cert_pem)
            key = serialization.load_pem_private_key(key_pem, password=None)
        except ValueError as exc:
            raise InvalidArgument(f"cannot load the CA: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidArgument("the CA key must be an EC private key")
        return cls(certificate=certificate, key=key)

    @property
    def cert_pem(self) -> bytes:
        return _cert_pem(self.certificate)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(
        self,
        identity: Identity,
        *,
        now: datetime,
        valid_for: timedelta = LEAF_VALIDITY,
        dns_names: Iterable[str] = DEFAULT_DNS_NAMES,
        ip_addresses: Iterable[str | IpAddress] = DEFAULT_IP_ADDRESSES,
    ) -> IssuedCert:
        """A leaf certificate for ``identity`` (which must be in this CA's trust domain)."""
        if identity.trust_domain != self.trust_domain:
            raise InvalidArgument(
                f"identity {identity} is not in this CA's trust domain {self.trust_domain!r}"
            )
        now = _aware(now)
        not_after = min(now + valid_for, self.certificate.not_valid_after_utc)
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
        sans += [x509.DNSName(_dns(d)) for d in dns_names]
        sans += [x509.IPAddress(_ip(ip)) for ip in ip_addresses]
        issuer_ski = self.certificate.extensions.get_extension_for_class(
            x509.SubjectKeyIdentifier
        ).value
        certificate = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
                        x509.NameAttribute(NameOID.COMMON_NAME, identity.uri[:64]),
                    ]
                )
            )
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return IssuedCert(
            identity=identity,
            cert_pem=_cert_pem(certificate),
            key_pem=_key_pem(key),
            ca_pem=self.cert_pem,
            not_after=not_after,
        )


__all__ = [
    "CA_VALIDITY",
    "CLOCK_SKEW",
    "DEFAULT_DNS_NAMES",
    "DEFAULT_IP_ADDRESSES",
    "LEAF_VALIDITY",
    "CertificateAuthority",
    "IssuedCert",
    "spiffe_ids_of",
]
