"""The object-store key layout of snapshots, and who owns which prefix.

Every snapshot object lives under the prefix of its owner, so a deletion can be gated on
ownership by looking at the key alone (only the owner ever deletes)::

    <location>/atespaces/<as>/actors/<actor-uid>/                          actor owner prefix
    <location>/atespaces/<as>/actors/<actor-uid>/snapshots/<snapshot-id>/  one actor snapshot
    <location>/atespaces/<as>/tags/<tag-uid>/                              a tag's snapshot

Inside a snapshot prefix each file is stored as ``<name>.zstd`` and ``manifest.json`` is
written last, as the commit marker (see :mod:`substrate.snapshot.manifest`).

Prefixes always end with ``/`` so that deleting ``.../snapshots/ab/`` can never touch
``.../snapshots/abc/``. Identifiers are checked before they become key segments: no empty
segments, no ``/`` or ``\\``, no ``..``, no whitespace or control characters.
"""

from __future__ import annotations

import enum
import re
from typing import Final

import attrs

from substrate.core.ids import validate_dns_label
from substrate.errors import InvalidArgument

MANIFEST_NAME: Final = "manifest.json"
"""The manifest object inside a snapshot prefix; written last, it commits the snapshot."""
DATA_SUFFIX: Final = ".zstd"
"""Suffix of every compressed snapshot file object."""

ID_MAX: Final = 253
FILE_NAME_MAX: Final = 255 - len(DATA_SUFFIX)

_ATESPACES: Final = "atespaces"
_ACTORS: Final = "actors"
_SNAPSHOTS: Final = "snapshots"
_TAGS: Final = "tags"

_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FILE_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
_SCHEME_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class PrefixKind(enum.Enum):
    """What a parsed object prefix names."""

    ACTOR = "actor"
    """The owner prefix of one actor (every snapshot it owns is below it)."""
    ACTOR_SNAPSHOT = "actor-snapshot"
    """One snapshot owned by an actor."""
    TAG = "tag"
    """The snapshot owned by a tag (a tag holds exactly one)."""


@attrs.frozen(slots=True, kw_only=True)
class SnapshotPrefix:
    """A parsed owner or snapshot prefix."""

    kind: PrefixKind
    location: str
    """The canonical storage location (see :func:`canonical_location`)."""
    atespace: str
    owner_uid: str
    """The actor UID (ACTOR, ACTOR_SNAPSHOT) or the tag UID (TAG)."""
    snapshot_id: str | None = None
    """Set only for ACTOR_SNAPSHOT."""

    @property
    def uri(self) -> str:
        """The prefix this record was parsed from, in canonical form (ends with ``/``)."""
        match self.kind:
            case PrefixKind.ACTOR:
                return actor_prefix(self.location, self.atespace, self.owner_uid)
            case PrefixKind.ACTOR_SNAPSHOT:
                assert self.snapshot_id is not None
                return actor_snapshot_prefix(
                    self.location, self.atespace, self.owner_uid, self.snapshot_id
                )
            case PrefixKind.TAG:
                return tag_prefix(self.location, self.atespace, self.owner_uid)


# --- validation -------------------------------------------------------------------------


def _check_text(value: object, *, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} is required")
    for ch in value:
        if ord(ch) < 0x21 or ord(ch) == 0x7F:
            raise InvalidArgument(
                f"{what} {value!r} must not contain whitespace or control characters"
            )
    return value


def validate_id(value: str, *, what: str) -> str:
    """Return ``value`` if it is safe as one key segment (a UID or snapshot id).

    Allowed: ASCII letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit,
    at most 253 characters, and no ``..``. Raises :class:`InvalidArgument` otherwise.
    """
    _check_text(value, what=what)
    if "/" in value or "\\" in value:
        raise InvalidArgument(f"{what} {value!r} must not contain '/' or '\\'")
    if ".." in value:
        raise InvalidArgument(f"{what} {value!r} must not contain '..'")
    if len(value) > ID_MAX:
        raise InvalidArgument(f"{what} {value!r} must be no more than {ID_MAX} characters")
    if not _ID_RE.match(value):
        raise InvalidArgument(
            f"{what} {value!r} is invalid: it must consist of ASCII letters, digits, '.', '_' "
            "or '-' and start with a letter or digit"
        )
    return value


def validate_file_name(value: str, *, what: str = "snapshot file name") -> str:
    """Return ``value`` if it is a safe snapshot file (or asset) name.

    Allowed: ASCII letters, digits, ``.``, ``_``, ``+`` and ``-``, starting with a letter,
    digit or ``_``, at most 250 characters, and no ``..``. Raises :class:`InvalidArgument`.
    """
    _check_text(value, what=what)
    if "/" in value or "\\" in value:
        raise InvalidArgument(f"{what} {value!r} must not contain '/' or '\\'")
    if ".." in value:
        raise InvalidArgument(f"{what} {value!r} must not contain '..'")
    if len(value) > FILE_NAME_MAX:
        raise InvalidArgument(f"{what} {value!r} must be no more than {FILE_NAME_MAX} characters")
    if not _FILE_NAME_RE.match(value):
        raise InvalidArgument(
            f"{what} {value!r} is invalid: it must consist of ASCII letters, digits, '.', '_', "
            "'+' or '-' and start with a letter, digit or '_'"
        )
    return value


def canonical_location(location: str) -> str:
    """The storage location with redundant trailing slashes removed.

    ``s3://bucket/x/`` → ``s3://bucket/x``; a root keeps its slashes (``memory://``,
    ``file:///``, ``/``), so appending ``atespaces/...`` still gives a key under it.
    Raises :class:`InvalidArgument` for an empty location, whitespace or control
    characters, or a ``.``/``..`` path segment.
    """
    _check_text(location, what="snapshot storage location")
    scheme = _SCHEME_RE.match(location)
    head = scheme.group(0) if scheme else ""
    tail = location[len(head) :]
    for segment in tail.split("/"):
        if segment in {".", ".."}:
            raise InvalidArgument(
                f"snapshot storage location {location!r} must not contain '.' or '..' segments"
            )
    stripped = tail.rstrip("/")
    if not stripped:
        if scheme:
            return location  # a bare root such as ``memory://`` or ``file:///``
        return "/"
    return head + stripped


def _join(location: str, *segments: str) -> str:
    base = canonical_location(location)
    if not base.endswith("/"):
        base += "/"
    return base + "".join(f"{s}/" for s in segments)


# --- building ---------------------------------------------------------------------------


def actor_prefix(location: str, atespace: str, actor_uid: str) -> str:
    """``<location>/atespaces/<as>/actors/<uid>/``: everything an actor owns."""
    validate_dns_label(atespace, what="atespace")
    validate_id(actor_uid, what="actor uid")
    return _join(location, _ATESPACES, atespace, _ACTORS, actor_uid)


def actor_snapshot_prefix(location: str, atespace: str, actor_uid: str, snapshot_id: str) -> str:
    """``<location>/atespaces/<as>/actors/<uid>/snapshots/<snapshot-id>/``."""
    validate_dns_label(atespace, what="atespace")
    validate_id(actor_uid, what="actor uid")
    validate_id(snapshot_id, what="snapshot id")
    return _join(location, _ATESPACES, atespace, _ACTORS, actor_uid, _SNAPSHOTS, snapshot_id)


def tag_prefix(location: str, atespace: str, tag_uid: str) -> str:
    """``<location>/atespaces/<as>/tags/<tag-uid>/``: the snapshot a tag owns."""
    validate_dns_label(atespace, what="atespace")
    validate_id(tag_uid, what="tag uid")
    return _join(location, _ATESPACES, atespace, _TAGS, tag_uid)


def _as_dir(prefix: str) -> str:
    _check_text(prefix, what="snapshot prefix")
    return prefix if prefix.endswith("/") else prefix + "/"


def object_key(prefix: str, file_name: str) -> str:
    """``<prefix><name>.zstd``: where a snapshot file is stored (a missing ``/`` is added)."""
    validate_file_name(file_name)
    return f"{_as_dir(prefix)}{file_name}{DATA_SUFFIX}"


def manifest_key(prefix: str) -> str:
    """``<prefix>manifest.json``: the commit marker of a snapshot (a missing ``/`` is added)."""
    return f"{_as_dir(prefix)}{MANIFEST_NAME}"


# --- parsing ----------------------------------------------------------------------------


def parse_prefix(uri: str) -> SnapshotPrefix:
    """Parse an owner or snapshot prefix built by this module (trailing ``/`` optional).

    Raises :class:`InvalidArgument` if ``uri`` is not one of the three layouts, has an
    invalid identifier, or is not in canonical form.
    """
    _check_text(uri, what="snapshot uri")
    body = uri[:-1] if uri.endswith("/") else uri
    parts = body.rsplit("/", 6)
    parsed: SnapshotPrefix | None = None
    if (
        len(parts) == 7
        and parts[1] == _ATESPACES
        and parts[3] == _ACTORS
        and parts[5] == _SNAPSHOTS
    ):
        parsed = SnapshotPrefix(
            kind=PrefixKind.ACTOR_SNAPSHOT,
            location=_parsed_location(parts[0], uri),
            atespace=parts[2],
            owner_uid=parts[4],
            snapshot_id=parts[6],
        )
    if parsed is None:
        parts = body.rsplit("/", 4)
        if len(parts) == 5 and parts[1] == _ATESPACES and parts[3] in {_ACTORS, _TAGS}:
            parsed = SnapshotPrefix(
                kind=PrefixKind.ACTOR if parts[3] == _ACTORS else PrefixKind.TAG,
                location=_parsed_location(parts[0], uri),
                atespace=parts[2],
                owner_uid=parts[4],
            )
    if parsed is None:
        raise InvalidArgument(
            f"snapshot uri {uri!r} is not under <location>/atespaces/<as>/actors/<uid>/ "
            "or <location>/atespaces/<as>/tags/<uid>/"
        )
    # Rebuilding validates every identifier and rejects non-canonical spellings.
    rebuilt = parsed.uri
    if rebuilt != body + "/":
        raise InvalidArgument(f"snapshot uri {uri!r} is not canonical (expected {rebuilt!r})")
    return parsed


def _parsed_location(head: str, uri: str) -> str:
    if not head and not uri.startswith("/"):
        raise InvalidArgument(f"snapshot uri {uri!r} has no storage location")
    return canonical_location(head + "/")


def owned_by_actor(uri: str, atespace: str, actor_uid: str) -> bool:
    """True if ``uri`` is the actor's owner prefix or one of its snapshots.

    Never raises: anything unparsable is not owned (so it is never deleted).
    """
    try:
        parsed = parse_prefix(uri)
    except InvalidArgument:
        return False
    return (
        parsed.kind in {PrefixKind.ACTOR, PrefixKind.ACTOR_SNAPSHOT}
        and parsed.atespace == atespace
        and parsed.owner_uid == actor_uid
    )


def owned_by_tag(uri: str, atespace: str, tag_uid: str) -> bool:
    """True if ``uri`` is the tag's prefix. Never raises (unparsable → not owned)."""
    try:
        parsed = parse_prefix(uri)
    except InvalidArgument:
        return False
    return (
        parsed.kind is PrefixKind.TAG
        and parsed.atespace == atespace
        and parsed.owner_uid == tag_uid
    )


__all__ = [
    "DATA_SUFFIX",
    "MANIFEST_NAME",
    "PrefixKind",
    "SnapshotPrefix",
    "actor_prefix",
    "actor_snapshot_prefix",
    "canonical_location",
    "manifest_key",
    "object_key",
    "owned_by_actor",
    "owned_by_tag",
    "parse_prefix",
    "tag_prefix",
    "validate_file_name",
    "validate_id",
]
