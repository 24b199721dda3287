"""The identity package's file I/O: writing and reading PEM bundles in a directory.

This is the only module of :mod:`substrate.identity` that touches the file system (apart
from :mod:`substrate.identity.tls`, whose ``ssl`` contexts load the files named here).

A directory of credentials (what ``ate up`` writes) holds ``ca.crt`` and, for each
component, ``<name>.crt`` and ``<name>.key``; keys are written with mode 0600. Writes are
atomic (a temporary file in the same directory, then a rename).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Final

import attrs

from substrate.identity.ca import CertificateAuthority, IssuedCert

CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
KEY_MODE: Final = 0o600
CERT_MODE: Final = 0o644


@attrs.frozen(slots=True)
class TlsFiles:
    """Paths of one component's certificate, key and the CA certificate."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def in_dir(cls, directory: str | os.PathLike[str], name: str) -> TlsFiles:
        """``<directory>/<name>.crt``, ``<directory>/<name>.key`` and ``<directory>/ca.crt``."""
        base = Path(directory)
        return cls(cert=base / f"{name}.crt", key=base / f"{name}.key", ca=base / CA_CERT)

    def missing(self) -> list[Path]:
        """The files that do not exist."""
        return [p for p in (self.cert, self.key, self.ca) if not p.is_file()]


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _name(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or name in ("ca",):
        raise ValueError(f"bundle name {name!r} is not a plain file name (nor 'ca')")
    return name


def write_bundle(directory: str | os.PathLike[str], name: str, issued: IssuedCert) -> TlsFiles:
    """Write ``<name>.crt``, ``<name>.key`` (0600) and ``ca.crt`` into ``directory``."""
    files = TlsFiles.in_dir(directory, _name(name))
    _write_atomic(files.key, issued.key_pem, KEY_MODE)
    _write_atomic(files.cert, issued.cert_pem, CERT_MODE)
    _write_atomic(files.ca, issued.ca_pem, CERT_MODE)
    return files


def write_ca(directory: str | os.PathLike[str], ca: CertificateAuthority) -> tuple[Path, Path]:
    """Write ``ca.crt`` and ``ca.key`` (0600); return their paths."""
    base = Path(directory)
    cert, key = base / CA_CERT, base / CA_KEY
    _write_atomic(key, ca.key_pem, KEY_MODE)
    _write_atomic(cert, ca.cert_pem, CERT_MODE)
    return cert, key


def load_ca(directory: str | os.PathLike[str]) -> CertificateAuthority:
    """The CA :func:`write_ca` wrote into ``directory``."""
    base = Path(directory)
    return CertificateAuthority.from_pem(
        (base / CA_CERT).read_bytes(), (base / CA_KEY).read_bytes()
    )


__all__ = ["CA_CERT", "CA_KEY", "KEY_MODE", "TlsFiles", "load_ca", "write_bundle", "write_ca"]
