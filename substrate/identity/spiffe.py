"""SPIFFE ids and the identities of substrate's components (pure: parsing and validation).

A SPIFFE id is ``spiffe://<trust-domain>/<path>``. substrate issues five kinds:

=========  ==============================  =============================================
kind       path                            who
=========  ==============================  =============================================
ATEAPI     ``/ateapi``                     the API server
ROUTER     ``/router``                     the router (resumes actors on demand)
ATELET     ``/atelet/<node>``              the node agent of one node
WORKER     ``/worker/<uid>``               one worker process
CLIENT     ``/client/<name>``              an operator or SDK user
=========  ==============================  =============================================

Parsing is strict, following the SPIFFE-ID specification: lower-case scheme and trust
domain (``[a-z0-9._-]``), no port, user info, query or fragment, path segments of
``[A-Za-z0-9._-]`` that are neither empty nor ``.``/``..``, no trailing slash, at most 2048
bytes. Every failure raises :class:`~substrate.errors.InvalidArgument`.
"""

from __future__ import annotations

import enum
import re
from typing import Final

import attrs

from substrate.core.ids import validate_dns_subdomain
from substrate.errors import InvalidArgument

SCHEME: Final = "spiffe"
MAX_ID_BYTES: Final = 2048
DEFAULT_TRUST_DOMAIN: Final = "ate"
"""The trust domain a local stack uses unless told otherwise."""

_TRUST_DOMAIN_RE: Final = re.compile(r"^[a-z0-9._-]+$")
_SEGMENT_RE: Final = re.compile(r"^[A-Za-z0-9._-]+$")
_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
_NAME_MAX: Final = 253


def validate_trust_domain(value: str) -> str:
    """Return ``value`` if it is a valid SPIFFE trust domain name."""
    if not value:
        raise InvalidArgument("SPIFFE trust domain is required")
    if not _TRUST_DOMAIN_RE.match(value):
        raise InvalidArgument(
            f"SPIFFE trust domain {value!r} is invalid: it may contain only lower-case "
            "letters, digits, '.', '-' and '_'"
        )
    return value


def _validate_path(path: str) -> tuple[str, ...]:
    if not path:
        return ()
    if not path.startswith("/"):
        raise InvalidArgument(f"SPIFFE path {path!r} must start with '/'")
    segments = tuple(path[1:].split("/"))
    for segment in segments:
        if not segment:
            raise InvalidArgument(f"SPIFFE path {path!r} has an empty segment or trailing '/'")
        if segment in (".", ".."):
            raise InvalidArgument(f"SPIFFE path {path!r} has a relative segment {segment!r}")
        if not _SEGMENT_RE.match(segment):
            raise InvalidArgument(
                f"SPIFFE path segment {segment!r} is invalid: it may contain only letters, "
                "digits, '.', '-' and '_'"
            )
    return segments


@attrs.frozen(slots=True, order=True)
class SpiffeId:
    """A validated SPIFFE id; ``str()`` gives the URI."""

    trust_domain: str
    path: str = ""
    """Empty (the trust domain's own id) or ``/seg/seg...``."""

    def __attrs_post_init__(self) -> None:
        validate_trust_domain(self.trust_domain)
        _validate_path(self.path)
        if len(str(self).encode()) > MAX_ID_BYTES:
            raise InvalidArgument(f"SPIFFE id is longer than {MAX_ID_BYTES} bytes")

    def __str__(self) -> str:
        return f"{SCHEME}://{self.trust_domain}{self.path}"

    @property
    def segments(self) -> tuple[str, ...]:
        return _validate_path(self.path)

    @classmethod
    def parse(cls, uri: str) -> SpiffeId:
        """Parse ``spiffe://<trust-domain>[/<path>]`` strictly."""
        if not isinstance(uri, str) or not uri:
            raise InvalidArgument("SPIFFE id is required")
        if len(uri.encode()) > MAX_ID_BYTES:
            raise InvalidArgument(f"SPIFFE id is longer than {MAX_ID_BYTES} bytes")
        prefix = f"{SCHEME}://"
        if not uri.startswith(prefix):
            raise InvalidArgument(f"SPIFFE id {uri!r} must start with {prefix!r}")
        rest = uri[len(prefix) :]
        for bad, what in (("?", "a query"), ("#", "a fragment"), ("%", "percent-encoding")):
            if bad in rest:
                raise InvalidArgument(f"SPIFFE id {uri!r} must not contain {what}")
        domain, slash, path = rest.partition("/")
        if "@" in domain:
            raise InvalidArgument(f"SPIFFE id {uri!r} must not contain user info")
        if ":" in domain:
            raise InvalidArgument(f"SPIFFE id {uri!r} must not contain a port")
        return cls(trust_domain=validate_trust_domain(domain), path=slash + path)


class IdentityKind(enum.Enum):
    """What a SPIFFE id names; the value is the first path segment."""

    ATEAPI = "ateapi"
    ROUTER = "router"
    ATELET = "atelet"
    WORKER = "worker"
    CLIENT = "client"

    @property
    def has_name(self) -> bool:
        """Whether the path carries a second segment (node, uid or client name)."""
        return self in (IdentityKind.ATELET, IdentityKind.WORKER, IdentityKind.CLIENT)


def _validate_name(kind: IdentityKind, name: str) -> str:
    if kind is IdentityKind.ATELET:
        return validate_dns_subdomain(name, what="atelet node name")
    if not name:
        raise InvalidArgument(f"{kind.value} identity needs a name")
    if len(name) > _NAME_MAX or not _NAME_RE.match(name):
        raise InvalidArgument(
            f"{kind.value} name {name!r} is invalid: it must be lower-case letters, digits, "
            f"'-', '_' or '.', start and end alphanumeric, at most {_NAME_MAX} characters"
        )
    return name


@attrs.frozen(slots=True)
class Identity:
    """A substrate component's identity; build with the class methods or :meth:`parse`."""

    kind: IdentityKind
    trust_domain: str
    name: str = ""
    """The node (ATELET), worker uid (WORKER) or client name (CLIENT); empty otherwise."""

    def __attrs_post_init__(self) -> None:
        validate_trust_domain(self.trust_domain)
        if self.kind.has_name:
            _validate_name(self.kind, self.name)
        elif self.name:
            raise InvalidArgument(f"{self.kind.value} identity takes no name")

    @classmethod
    def ateapi(cls, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity:
        return cls(IdentityKind.ATEAPI, trust_domain)

    @classmethod
    def router(cls, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity:
        return cls(IdentityKind.ROUTER, trust_domain)

    @classmethod
    def atelet(cls, node: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity:
        return cls(IdentityKind.ATELET, trust_domain, node)

    @classmethod
    def worker(cls, uid: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity:
        return cls(IdentityKind.WORKER, trust_domain, uid)

    @classmethod
    def client(cls, name: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity:
        return cls(IdentityKind.CLIENT, trust_domain, name)

    @property
    def spiffe_id(self) -> SpiffeId:
        path = f"/{self.kind.value}/{self.name}" if self.kind.has_name else f"/{self.kind.value}"
        return SpiffeId(trust_domain=self.trust_domain, path=path)

    @property
    def uri(self) -> str:
        return str(self.spiffe_id)

    def __str__(self) -> str:
        return self.uri

    @classmethod
    def from_spiffe_id(cls, spiffe_id: SpiffeId, *, trust_domain: str | None = None) -> Identity:
        """The identity ``spiffe_id`` names; ``trust_domain`` (if given) must match."""
        if trust_domain is not None and spiffe_id.trust_domain != trust_domain:
            raise InvalidArgument(f"SPIFFE id {spiffe_id} is not in trust domain {trust_domain!r}")
        segments = spiffe_id.segments
        if not segments:
            raise InvalidArgument(f"SPIFFE id {spiffe_id} names a trust domain, not a workload")
        try:
            kind = IdentityKind(segments[0])
        except ValueError:
            raise InvalidArgument(
                f"SPIFFE id {spiffe_id} is of no known kind "
                f"({', '.join(k.value for k in IdentityKind)})"
            ) from None
        expected = 2 if kind.has_name else 1
        if len(segments) != expected:
            shape = f"/{kind.value}/<name>" if kind.has_name else f"/{kind.value}"
            raise InvalidArgument(f"SPIFFE id {spiffe_id} must have the path {shape}")
        name = segments[1] if kind.has_name else ""
        return cls(kind, spiffe_id.trust_domain, name)

    @classmethod
    def parse(cls, uri: str, *, trust_domain: str | None = None) -> Identity:
        """The identity of a SPIFFE URI; ``trust_domain`` (if given) must match."""
        return cls.from_spiffe_id(SpiffeId.parse(uri), trust_domain=trust_domain)


__all__ = [
    "DEFAULT_TRUST_DOMAIN",
    "MAX_ID_BYTES",
    "Identity",
    "IdentityKind",
    "SpiffeId",
    "validate_trust_domain",
]
