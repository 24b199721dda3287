"""SPIFFE ids and identities: strict parsing, the five kinds, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.errors import InvalidArgument
from substrate.identity.spiffe import (
    MAX_ID_BYTES,
    Identity,
    IdentityKind,
    SpiffeId,
    validate_trust_domain,
)


@pytest.mark.parametrize(
    ("uri", "domain", "path"),
    [
        ("spiffe://ate", "ate", ""),
        ("spiffe://ate/router", "ate", "/router"),
        ("spiffe://prod.example-1_x/atelet/node-0", "prod.example-1_x", "/atelet/node-0"),
        ("spiffe://ate/A.b-c_d/E", "ate", "/A.b-c_d/E"),
    ],
)
def test_valid_ids_parse_and_print_back(uri: str, domain: str, path: str) -> None:
    sid = SpiffeId.parse(uri)
    assert (sid.trust_domain, sid.path) == (domain, path)
    assert str(sid) == uri


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "required"),
        ("https://ate/router", "must start with"),
        ("SPIFFE://ate/router", "must start with"),
        ("spiffe://", "trust domain is required"),
        ("spiffe://Ate/router", "lower-case"),
        ("spiffe://ate:443/router", "port"),
        ("spiffe://user@ate/router", "user info"),
        ("spiffe://ate/router?x=1", "query"),
        ("spiffe://ate/router#frag", "fragment"),
        ("spiffe://ate/ro%20uter", "percent"),
        ("spiffe://ate/", "empty segment"),
        ("spiffe://ate//router", "empty segment"),
        ("spiffe://ate/router/", "trailing"),
        ("spiffe://ate/./router", "relative"),
        ("spiffe://ate/../router", "relative"),
        ("spiffe://ate/rou ter", "segment"),
        ("spiffe://ate/" + "x" * MAX_ID_BYTES, "longer than"),
    ],
)
def test_invalid_ids_are_refused(uri: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        SpiffeId.parse(uri)


def test_trust_domain_validation() -> None:
    assert validate_trust_domain("a.b-c_d9") == "a.b-c_d9"
    for bad in ("", "A", "a b", "a/b", "ä"):
        with pytest.raises(InvalidArgument):
            validate_trust_domain(bad)


@pytest.mark.parametrize(
    ("identity", "uri"),
    [
        (Identity.ateapi(), "spiffe://ate/ateapi"),
        (Identity.router("prod"), "spiffe://prod/router"),
        (Identity.atelet("node-0.rack-1"), "spiffe://ate/atelet/node-0.rack-1"),
        (
            Identity.worker("0b8e6c1a-3c8d-4c52-9a55-0f3b7c1d2e4f"),
            "spiffe://ate/worker/0b8e6c1a-3c8d-4c52-9a55-0f3b7c1d2e4f",
        ),
        (Identity.client("alice_ops.1"), "spiffe://ate/client/alice_ops.1"),
    ],
)
def test_identities_map_to_their_spiffe_ids(identity: Identity, uri: str) -> None:
    assert identity.uri == uri
    assert str(identity) == uri
    assert Identity.parse(uri) == identity
    assert Identity.parse(uri, trust_domain=identity.trust_domain) == identity


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("spiffe://ate", "names a trust domain"),
        ("spiffe://ate/admin", "no known kind"),
        ("spiffe://ate/router/extra", "/router"),
        ("spiffe://ate/atelet", "/atelet/<name>"),
        ("spiffe://ate/client/a/b", "/client/<name>"),
        ("spiffe://ate/atelet/Node_0", "node name"),
        ("spiffe://ate/client/-x", "client name"),
        ("spiffe://other/router", "not in trust domain"),
    ],
)
def test_ids_that_name_no_identity_are_refused(uri: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Identity.parse(uri, trust_domain="ate")


def test_identity_construction_validates() -> None:
    with pytest.raises(InvalidArgument, match="takes no name"):
        Identity(IdentityKind.ROUTER, "ate", "x")
    with pytest.raises(InvalidArgument, match="needs a name"):
        Identity(IdentityKind.CLIENT, "ate")
    with pytest.raises(InvalidArgument):
        Identity.ateapi("Bad Domain")


NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True).filter(
    lambda n: ".." not in n and "-." not in n and ".-" not in n
)
IDENTITIES = st.one_of(
    st.builds(Identity.ateapi, st.just("ate")),
    st.builds(Identity.router, st.sampled_from(["ate", "prod.example"])),
    st.builds(Identity.atelet, NAMES),
    st.builds(Identity.worker, NAMES),
    st.builds(Identity.client, NAMES),
)


@given(IDENTITIES)
def test_identity_round_trips(identity: Identity) -> None:
    assert Identity.parse(identity.uri) == identity
    assert identity.spiffe_id.segments[0] == identity.kind.value


@given(st.one_of(st.text(max_size=60), st.text(max_size=40).map(lambda t: "spiffe://" + t)))
def test_parsing_anything_either_succeeds_or_is_invalid_argument(text: str) -> None:
    try:
        identity = Identity.parse(text)
    except InvalidArgument:
        return
    assert identity.uri == text
