"""The object-key layout: building, parsing, ownership and id validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.errors import InvalidArgument
from substrate.snapshot import (
    PrefixKind,
    actor_prefix,
    actor_snapshot_prefix,
    canonical_location,
    manifest_key,
    object_key,
    owned_by_actor,
    owned_by_tag,
    parse_prefix,
    tag_prefix,
    validate_file_name,
    validate_id,
)

UID = "5f0c7a4e-8d1b-4c7e-9a52-3c1b2f9e0d11"
SID = "c3d2a1b0-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("s3://bucket/ate", f"s3://bucket/ate/atespaces/team/actors/{UID}/snapshots/{SID}/"),
        ("s3://bucket/ate/", f"s3://bucket/ate/atespaces/team/actors/{UID}/snapshots/{SID}/"),
        ("s3://bucket/ate///", f"s3://bucket/ate/atespaces/team/actors/{UID}/snapshots/{SID}/"),
        ("s3://bucket", f"s3://bucket/atespaces/team/actors/{UID}/snapshots/{SID}/"),
        (
            "file:///var/lib/ate/objects",
            f"file:///var/lib/ate/objects/atespaces/team/actors/{UID}/snapshots/{SID}/",
        ),
        ("file:///", f"file:///atespaces/team/actors/{UID}/snapshots/{SID}/"),
        ("memory://", f"memory://atespaces/team/actors/{UID}/snapshots/{SID}/"),
        ("/srv/objects/", f"/srv/objects/atespaces/team/actors/{UID}/snapshots/{SID}/"),
        ("/", f"/atespaces/team/actors/{UID}/snapshots/{SID}/"),
    ],
)
def test_actor_snapshot_prefix(location: str, expected: str) -> None:
    assert actor_snapshot_prefix(location, "team", UID, SID) == expected


def test_owner_and_tag_prefixes() -> None:
    assert actor_prefix("s3://b/x/", "team", UID) == f"s3://b/x/atespaces/team/actors/{UID}/"
    assert tag_prefix("s3://b/x", "team", "tag-uid-1") == "s3://b/x/atespaces/team/tags/tag-uid-1/"
    # Every snapshot of an actor lies under its owner prefix.
    assert actor_snapshot_prefix("s3://b/x", "team", UID, SID).startswith(
        actor_prefix("s3://b/x", "team", UID)
    )


def test_object_and_manifest_keys() -> None:
    prefix = actor_snapshot_prefix("s3://b/x", "team", UID, SID)
    assert object_key(prefix, "pages.img") == f"{prefix}pages.img.zstd"
    assert manifest_key(prefix) == f"{prefix}manifest.json"
    # A prefix stored without its trailing slash gives the same keys.
    assert object_key(prefix.rstrip("/"), "pages.img") == f"{prefix}pages.img.zstd"
    assert manifest_key(prefix.rstrip("/")) == f"{prefix}manifest.json"
    assert object_key(prefix, "app_rootfs_fscheckpoint.pb").endswith(
        "/app_rootfs_fscheckpoint.pb.zstd"
    )


def test_parse_each_kind() -> None:
    snap = parse_prefix(actor_snapshot_prefix("s3://b/x", "team", UID, SID))
    assert (snap.kind, snap.location, snap.atespace, snap.owner_uid, snap.snapshot_id) == (
        PrefixKind.ACTOR_SNAPSHOT,
        "s3://b/x",
        "team",
        UID,
        SID,
    )
    owner = parse_prefix(actor_prefix("memory://", "team", UID))
    assert (owner.kind, owner.location, owner.owner_uid, owner.snapshot_id) == (
        PrefixKind.ACTOR,
        "memory://",
        UID,
        None,
    )
    tag = parse_prefix(tag_prefix("file:///", "team", "t-1"))
    assert (tag.kind, tag.location, tag.owner_uid) == (PrefixKind.TAG, "file:///", "t-1")


def test_parse_accepts_a_missing_trailing_slash() -> None:
    prefix = actor_snapshot_prefix("s3://b/x", "team", UID, SID)
    assert parse_prefix(prefix.rstrip("/")) == parse_prefix(prefix)


def test_parse_with_names_that_look_like_layout_words() -> None:
    # An atespace may be called "atespaces" or "actors"; positions decide, not words.
    prefix = actor_snapshot_prefix("s3://b/atespaces", "actors", "snapshots", "tags")
    parsed = parse_prefix(prefix)
    assert (parsed.location, parsed.atespace, parsed.owner_uid, parsed.snapshot_id) == (
        "s3://b/atespaces",
        "actors",
        "snapshots",
        "tags",
    )


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "s3://b/x",
        "s3://b/x/atespaces/team/actors/",
        f"atespaces/team/actors/{UID}",
        f"s3://b/x/atespaces/team/actors/{UID}/snapshots/",
        f"s3://b/x/atespaces/team/actors/{UID}/snapshots//",
        f"s3://b/x/atespaces/team/actors/{UID}/other/{SID}/",
        f"s3://b/x/atespaces/team/volumes/{UID}/",
        f"s3://b/x/atespaces/Team/actors/{UID}/",
        f"s3://b/x/atespaces/team/actors/../snapshots/{SID}/",
        f"s3://b/x/atespaces/team/actors/{UID}/snapshots/../",
        "s3://b/x/atespaces/team/tags/../",
        "s3://b/x/atespaces/team/tags/a b/",
        f"s3://b/x//atespaces/team/tags/{UID}/",
        f"s3://b/../atespaces/team/tags/{UID}/",
    ],
)
def test_parse_rejects(uri: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_prefix(uri)


def test_ownership() -> None:
    snapshot = actor_snapshot_prefix("s3://b/x", "team", UID, SID)
    owner = actor_prefix("s3://b/x", "team", UID)
    tag = tag_prefix("s3://b/x", "team", UID)
    assert owned_by_actor(snapshot, "team", UID)
    assert owned_by_actor(owner, "team", UID)
    assert not owned_by_actor(tag, "team", UID)
    assert not owned_by_actor(snapshot, "other", UID)
    assert not owned_by_actor(snapshot, "team", "someone-else")
    assert owned_by_tag(tag, "team", UID)
    assert not owned_by_tag(snapshot, "team", UID)
    assert not owned_by_tag(tag, "team", "t-2")
    # Unparsable uris are owned by nobody, so nobody deletes them.
    assert not owned_by_actor(f"s3://b/x/atespaces/team/actors/{UID}/../../", "team", UID)
    assert not owned_by_actor("", "team", UID)
    assert not owned_by_tag("s3://b/x", "team", UID)


@pytest.mark.parametrize(
    "bad",
    ["", ".", "..", "../x", "a/b", "a\\b", "a..b", "-x", ".hidden", "a b", "a\nb", "é", "x" * 254],
)
def test_validate_id_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        validate_id(bad, what="actor uid")
    with pytest.raises(InvalidArgument):
        actor_prefix("s3://b", "team", bad)
    with pytest.raises(InvalidArgument):
        tag_prefix("s3://b", "team", bad)
    with pytest.raises(InvalidArgument):
        actor_snapshot_prefix("s3://b", "team", UID, bad)


def test_validate_id_message_names_the_field() -> None:
    with pytest.raises(InvalidArgument, match=r"snapshot id 'a\.\.b' must not contain '\.\.'"):
        actor_snapshot_prefix("s3://b", "team", UID, "a..b")
    with pytest.raises(InvalidArgument, match=r"actor uid '\.\./x' must not contain '/'"):
        actor_prefix("s3://b", "team", "../x")
    with pytest.raises(InvalidArgument, match="must not contain '/'"):
        tag_prefix("s3://b", "team", "a/b")


@pytest.mark.parametrize("bad", ["", "Team", "a_b", "a/b", "..", "-a"])
def test_atespace_must_be_a_dns_label(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        actor_prefix("s3://b", bad, UID)


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../etc/passwd", "a\\b", "a b", ".x"])
def test_validate_file_name_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        validate_file_name(bad)
    with pytest.raises(InvalidArgument):
        object_key("s3://b/x/", bad)


@pytest.mark.parametrize("bad", ["", " ", "s3://b/../x", "/srv/./x", "s3://b/x\n"])
def test_location_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        canonical_location(bad)
    with pytest.raises(InvalidArgument):
        tag_prefix(bad, "team", UID)


def test_manifest_key_rejects_empty_prefix() -> None:
    with pytest.raises(InvalidArgument):
        manifest_key("")


# --- properties -------------------------------------------------------------------------

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True).filter(
    lambda s: ".." not in s
)
atespaces = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
segments = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,10}", fullmatch=True).filter(
    lambda s: ".." not in s
)
locations = st.builds(
    lambda head, parts, trailing: head + "/".join(parts) + trailing,
    st.sampled_from(("s3://", "gs://", "file:///", "memory://", "/", "")),
    st.lists(segments, min_size=1, max_size=4),
    st.sampled_from(("", "/", "//")),
)


@given(location=locations, atespace=atespaces, uid=ids, sid=ids)
def test_property_layout_round_trips(location: str, atespace: str, uid: str, sid: str) -> None:
    canonical = canonical_location(location)
    assert canonical_location(canonical) == canonical
    for prefix, kind, snapshot_id in (
        (actor_snapshot_prefix(location, atespace, uid, sid), PrefixKind.ACTOR_SNAPSHOT, sid),
        (actor_prefix(location, atespace, uid), PrefixKind.ACTOR, None),
        (tag_prefix(location, atespace, uid), PrefixKind.TAG, None),
    ):
        assert prefix.endswith("/")
        assert "//atespaces/" not in prefix.split("://", 1)[-1]
        parsed = parse_prefix(prefix)
        assert parsed.kind is kind
        assert parsed.location == canonical
        assert (parsed.atespace, parsed.owner_uid, parsed.snapshot_id) == (
            atespace,
            uid,
            snapshot_id,
        )
        assert parsed.uri == prefix
        assert parse_prefix(prefix.rstrip("/")) == parsed
        assert owned_by_actor(prefix, atespace, uid) is (kind is not PrefixKind.TAG)
        assert owned_by_tag(prefix, atespace, uid) is (kind is PrefixKind.TAG)
    # The snapshot prefix is inside the owner prefix, and never inside a sibling's.
    snapshot = actor_snapshot_prefix(location, atespace, uid, sid)
    assert snapshot.startswith(actor_prefix(location, atespace, uid))
    assert not snapshot.startswith(actor_prefix(location, atespace, uid + "x"))
    assert not actor_snapshot_prefix(location, atespace, uid, sid + "x").startswith(snapshot)


@given(bad=st.text(min_size=1, max_size=12).map(lambda s: s + "/..") | st.just(".."))
def test_property_traversal_never_builds_a_key(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        actor_snapshot_prefix("s3://b", "team", UID, bad)
    with pytest.raises(InvalidArgument):
        object_key("s3://b/", bad)
