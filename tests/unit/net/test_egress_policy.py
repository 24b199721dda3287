"""The egress allow-list and the upstream proxy address: parsing and matching."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.errors import InvalidArgument
from substrate.net.egress_policy import EgressPolicy, EgressRule, EgressUpstream


def test_rules_parse() -> None:
    assert EgressRule.parse("10.0.0.0/8") == EgressRule(ipaddress.IPv4Network("10.0.0.0/8"))
    assert EgressRule.parse(" 192.0.2.7:443 ") == EgressRule(
        ipaddress.IPv4Network("192.0.2.7/32"), 443
    )
    assert EgressRule.parse("0.0.0.0/0:443") == EgressRule(ipaddress.IPv4Network("0.0.0.0/0"), 443)
    assert EgressRule.parse("192.0.2.7/32") == EgressRule(ipaddress.IPv4Network("192.0.2.7/32"))


def test_rules_print_as_they_parse() -> None:
    for text in ["10.0.0.0/8", "192.0.2.7:443", "0.0.0.0/0:443", "192.0.2.7"]:
        assert str(EgressRule.parse(text)) == text


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ("", "empty egress rule"),
        ("   ", "empty egress rule"),
        ("10.0.0.1/8", "host bits set (did you mean 10.0.0.0/8?)"),
        ("10.0.0.0/33", "bad prefix length"),
        ("10.0.0.0/x", "bad prefix length"),
        ("example.com", "not an IPv4 address or network"),
        ("256.1.1.1", "not an IPv4 address or network"),
        ("10.0.0.0/8:", "port '' is not a number"),
        ("10.0.0.0/8:0", "port '0' is not a number from 1 to 65535"),
        ("10.0.0.0/8:65536", "from 1 to 65535"),
        ("10.0.0.0/8:http", "port 'http'"),
        ("10.0.0.0/8:-1", "port '-1'"),
        ("::1", "IPv6 is not supported"),
        ("[::1]:443", "IPv6 is not supported"),
        ("2001:db8::/32", "IPv6 is not supported"),
    ],
)
def test_bad_rules_say_what_is_wrong(entry: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match="egress rule") as caught:
        EgressRule.parse(entry)
    assert match in caught.value.description


def test_non_string_rule_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="not a string"):
        EgressRule.parse(443)  # type: ignore[arg-type]


def test_policy_default_denies() -> None:
    assert not EgressPolicy().allows("192.0.2.7", 443)
    assert not EgressPolicy.deny_all().allows("10.0.0.1", 80)
    assert str(EgressPolicy()) == "deny-all"


def test_policy_matches_networks_and_ports() -> None:
    policy = EgressPolicy.parse(["10.0.0.0/8", "192.0.2.7:443", "0.0.0.0/0:8443"])
    assert policy.allows("10.1.2.3", 1)
    assert policy.allows("10.255.255.255", 65535)
    assert policy.allows("192.0.2.7", 443)
    assert not policy.allows("192.0.2.7", 80)
    assert not policy.allows("192.0.2.8", 443)
    assert policy.allows("198.51.100.1", 8443)
    assert not policy.allows("198.51.100.1", 443)
    assert not policy.allows("11.0.0.1", 80)


def test_policy_parses_one_string() -> None:
    policy = EgressPolicy.parse("10.0.0.0/8, 192.0.2.7:443\n0.0.0.0/0:8443")
    assert str(policy) == "10.0.0.0/8,192.0.2.7:443,0.0.0.0/0:8443"
    assert EgressPolicy.parse("") == EgressPolicy()


def test_policy_rejects_malformed_destinations() -> None:
    policy = EgressPolicy.parse("0.0.0.0/0")
    assert not policy.allows("not-an-ip", 80)
    assert not policy.allows("::1", 80)
    assert not policy.allows("10.0.0.1", 0)
    assert not policy.allows("10.0.0.1", 70000)
    assert not policy.allows("10.0.0.1", True)


def test_policy_names_the_bad_entry() -> None:
    with pytest.raises(InvalidArgument, match=r"'10\.0\.0\.1/8'"):
        EgressPolicy.parse(["192.0.2.7:443", "10.0.0.1/8"])


@given(
    ip=st.ip_addresses(v=4),
    port=st.integers(1, 65535),
    prefix=st.integers(0, 32),
    rule_port=st.one_of(st.none(), st.integers(1, 65535)),
)
def test_policy_agrees_with_ipaddress(
    ip: ipaddress.IPv4Address, port: int, prefix: int, rule_port: int | None
) -> None:
    network = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    text = str(network) + ("" if rule_port is None else f":{rule_port}")
    policy = EgressPolicy.parse([text])
    assert policy.allows(str(ip), port) == (rule_port is None or rule_port == port)
    outside = ipaddress.IPv4Address((int(network.broadcast_address) + 1) % 2**32)
    if outside not in network:
        assert not policy.allows(str(outside), port)


def test_upstream_parses() -> None:
    assert EgressUpstream.parse("proxy.internal:3128") == EgressUpstream("proxy.internal", 3128)
    assert EgressUpstream.parse("127.0.0.1:8080") == EgressUpstream("127.0.0.1", 8080)
    assert str(EgressUpstream.parse(" 10.0.0.1:1 ")) == "10.0.0.1:1"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("proxy", "expected host:port"),
        (":3128", "expected host:port"),
        ("proxy:", "port '' is not a number"),
        ("proxy:99999", "from 1 to 65535"),
        ("bad host:80", "not a host name"),
        ("-proxy:80", "not a host name"),
    ],
)
def test_bad_upstreams_say_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match="egress upstream proxy") as caught:
        EgressUpstream.parse(text)
    assert match in caught.value.description
