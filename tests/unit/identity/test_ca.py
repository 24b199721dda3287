"""The CA: a self-signed EC P-256 root for a trust domain, SPIFFE leaves, PEM files."""

from __future__ import annotations

import ipaddress
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from substrate.errors import InvalidArgument
from substrate.identity import (
    CertificateAuthority,
    Identity,
    TlsFiles,
    load_ca,
    write_bundle,
    write_ca,
)
from substrate.identity.ca import CLOCK_SKEW, spiffe_ids_of

NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create("ate", now=NOW)


def test_ca_is_a_self_signed_p256_root_naming_its_trust_domain(ca: CertificateAuthority) -> None:
    cert = ca.certificate
    assert ca.trust_domain == "ate"
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    cert.verify_directly_issued_by(cert)
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical
    assert basic.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert spiffe_ids_of(cert) == ("spiffe://ate",)
    assert cert.not_valid_before_utc == NOW - CLOCK_SKEW


def test_leaf_carries_one_spiffe_id_and_loopback_sans(ca: CertificateAuthority) -> None:
    issued = ca.issue(Identity.atelet("node-0"), now=NOW, dns_names=("localhost", "node-0.lan"))
    cert = issued.certificate
    cert.verify_directly_issued_by(ca.certificate)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://ate/atelet/node-0"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "node-0.lan"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert issued.spiffe_id.path == "/atelet/node-0"
    assert issued.ca_pem == ca.cert_pem
    assert issued.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert cert.not_valid_after_utc == issued.not_after


def test_leaves_never_outlive_the_ca() -> None:
    short = CertificateAuthority.create("ate", now=NOW, valid_for=timedelta(days=2))
    issued = short.issue(Identity.router(), now=NOW, valid_for=timedelta(days=365))
    assert issued.not_after == short.certificate.not_valid_after_utc


def test_issue_refuses_other_trust_domains_and_bad_inputs(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidArgument, match="trust domain"):
        ca.issue(Identity.router("other"), now=NOW)
    with pytest.raises(InvalidArgument, match="timezone"):
        ca.issue(Identity.router(), now=datetime(2030, 1, 1))
    with pytest.raises(InvalidArgument, match="IP address"):
        ca.issue(Identity.router(), now=NOW, ip_addresses=("not-an-ip",))
    with pytest.raises(InvalidArgument, match="DNS name"):
        ca.issue(Identity.router(), now=NOW, dns_names=("has space",))


def test_ca_round_trips_through_pem(ca: CertificateAuthority) -> None:
    again = CertificateAuthority.from_pem(ca.cert_pem, ca.key_pem)
    assert again.trust_domain == "ate"
    assert again.certificate == ca.certificate
    other = CertificateAuthority.create("ate", now=NOW)
    with pytest.raises(InvalidArgument, match="does not match"):
        CertificateAuthority.from_pem(ca.cert_pem, other.key_pem)
    with pytest.raises(InvalidArgument, match="cannot load"):
        CertificateAuthority.from_pem(b"garbage", ca.key_pem)
    leaf = ca.issue(Identity.router(), now=NOW)
    with pytest.raises(InvalidArgument, match="must name a trust domain"):
        CertificateAuthority.from_pem(leaf.cert_pem, leaf.key_pem)


def test_write_bundle_writes_cert_key_0600_and_ca(ca: CertificateAuthority, tmp_path: Path) -> None:
    issued = ca.issue(Identity.client("alice"), now=NOW)
    files = write_bundle(tmp_path / "tls", "alice", issued)
    assert files == TlsFiles.in_dir(tmp_path / "tls", "alice")
    assert files.missing() == []
    assert files.cert.read_bytes() == issued.cert_pem
    assert files.key.read_bytes() == issued.key_pem
    assert files.ca.read_bytes() == ca.cert_pem
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.cert.stat().st_mode) == 0o644
    # Rewriting keeps the mode and leaves no temporary files behind.
    write_bundle(tmp_path / "tls", "alice", ca.issue(Identity.client("alice"), now=NOW))
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == [
        "alice.crt",
        "alice.key",
        "ca.crt",
    ]
    for bad in ("", "ca", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="plain file name"):
            write_bundle(tmp_path, bad, issued)


def test_write_and_load_the_ca(ca: CertificateAuthority, tmp_path: Path) -> None:
    cert, key = write_ca(tmp_path, ca)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert cert.name == "ca.crt"
    loaded = load_ca(tmp_path)
    assert loaded.certificate == ca.certificate
    assert loaded.issue(Identity.router(), now=NOW).ca_pem == ca.cert_pem
