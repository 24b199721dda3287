"""The egress table's nftables text: golden output and input checks."""

# ruff: noqa: E501 (the golden rules are single long lines, as nft takes them)

from __future__ import annotations

import pytest

from substrate.errors import InvalidArgument
from substrate.net.nft_ruleset import (
    check_ifname,
    check_table_name,
    render_delete_table,
    render_egress_table,
)

GOLDEN_TWO = """\
table ip ate_egress {}
delete table ip ate_egress
table ip ate_egress {
\tchain prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tiifname "av1a2b3*" meta l4proto tcp redirect to : iifname map { "av1a2b300000001" : 40001, "av1a2b3ffffffff" : 40002 }
\t}
\tchain input {
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname "av1a2b3*" ct state established,related accept
\t\tiifname "av1a2b3*" meta l4proto icmp accept
\t\tiifname . ip daddr . tcp dport { "av1a2b300000001" . 169.254.17.1 . 40001, "av1a2b3ffffffff" . 169.254.17.1 . 40002 } accept
\t\tiifname "av1a2b3*" drop
\t}
\tchain forward {
\t\ttype filter hook forward priority filter; policy accept;
\t\tiifname "av1a2b3*" drop
\t\toifname "av1a2b3*" drop
\t}
}
"""

GOLDEN_EMPTY = """\
table ip ate_egress {}
delete table ip ate_egress
table ip ate_egress {
\tchain prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t}
\tchain input {
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname "av1a2b3*" ct state established,related accept
\t\tiifname "av1a2b3*" meta l4proto icmp accept
\t\tiifname "av1a2b3*" drop
\t}
\tchain forward {
\t\ttype filter hook forward priority filter; policy accept;
\t\tiifname "av1a2b3*" drop
\t\toifname "av1a2b3*" drop
\t}
}
"""


def test_two_actors_golden() -> None:
    # given in reverse order: the output is sorted by veth name
    ports = {"av1a2b3ffffffff": 40002, "av1a2b300000001": 40001}
    assert render_egress_table("ate_egress", "av1a2b3", "169.254.17.1", ports) == GOLDEN_TWO


def test_no_actors_only_drops_golden() -> None:
    assert render_egress_table("ate_egress", "av1a2b3", "169.254.17.1", {}) == GOLDEN_EMPTY


def test_delete_golden() -> None:
    assert render_delete_table("ate_egress") == (
        "table ip ate_egress {}\ndelete table ip ate_egress\n"
    )


def test_gateway_is_normalised_and_used_in_the_accept_rule() -> None:
    text = render_egress_table("t", "av", "10.0.0.1", {"av1": 1})
    assert '"av1" . 10.0.0.1 . 1 }' in text


@pytest.mark.parametrize(
    ("ports", "match"),
    [
        ({"zz1": 40001}, "does not start with"),
        ({"av1": 0}, "1..65535"),
        ({"av1": 65536}, "1..65535"),
        ({"av1": True}, "1..65535"),
        ({"av1": "80"}, "1..65535"),
        ({'av"; drop': 1}, "may only contain"),
        ({"av" + "x" * 14: 1}, "1 to 15"),
    ],
)
def test_bad_ports_are_rejected(ports: dict[str, int], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        render_egress_table("t", "av", "169.254.17.1", ports)


@pytest.mark.parametrize("table", ["", "1abc", "a b", "a;b", "a-b", "x" * 65, "ip{"])
def test_bad_table_names_are_rejected(table: str) -> None:
    with pytest.raises(InvalidArgument, match="table name"):
        render_egress_table(table, "av", "169.254.17.1", {})
    with pytest.raises(InvalidArgument, match="table name"):
        render_delete_table(table)


@pytest.mark.parametrize("prefix", ["", "a*", "a b", '"', "x" * 15])
def test_bad_prefixes_are_rejected(prefix: str) -> None:
    with pytest.raises(InvalidArgument, match="veth prefix"):
        render_egress_table("t", prefix, "169.254.17.1", {})


@pytest.mark.parametrize("gateway", ["", "169.254.17", "::1", "host"])
def test_bad_gateways_are_rejected(gateway: str) -> None:
    with pytest.raises(InvalidArgument, match="gateway"):
        render_egress_table("t", "av", gateway, {})


def test_name_checks_return_their_input() -> None:
    assert check_table_name("ate_egress_1") == "ate_egress_1"
    assert check_ifname("av1.2-3_4") == "av1.2-3_4"
    with pytest.raises(InvalidArgument, match="host veth"):
        check_ifname("-x", what="host veth")


def test_two_veths_may_share_a_port() -> None:
    # Listeners are bound to their own veth, so the kernel may give two the same port.
    text = render_egress_table("t1", "av", "169.254.17.1", {"av1": 40001, "av2": 40001})
    assert '"av1" : 40001, "av2" : 40001' in text
