"""Where an actor's network lives on its worker: names and addresses (pure).

Every actor gets its own network namespace with one veth pair: the actor side is ``eth0``
inside the namespace with :data:`ACTOR_ADDRESS`/30, the host side (in the worker's
namespace) carries :data:`GATEWAY_ADDRESS`/30. Every actor of every worker uses the same
two addresses; the host-side veth name tells them apart (connect with
``SO_BINDTODEVICE``), and nftables rules are keyed on it.

Names are derived from the worker name and the actor uid alone, so a restarted worker
finds what an earlier run of it left behind (by prefix) and removes it:

* host veth: ``av<worker tag 5 hex><actor tag 8 hex>`` (15 characters, the kernel's limit);
* namespace: ``ate-<worker tag>-<actor tag>``.
"""

from __future__ import annotations

import hashlib
from typing import Final

import attrs

from substrate.errors import InvalidArgument
from substrate.sandbox.spec import NETNS_DIR

ACTOR_ADDRESS: Final = "169.254.17.2"
"""The actor's address inside its namespace (every actor has the same one)."""
GATEWAY_ADDRESS: Final = "169.254.17.1"
"""The host side of the actor's veth: the actor's default gateway."""
PREFIX_LEN: Final = 30
ACTOR_MAC: Final = "02:00:a9:fe:11:02"
"""Fixed MAC of the actor's eth0: netstack copies it, so the sandbox NIC is the same on
every worker (a restore elsewhere sees the same device)."""
GATEWAY_MAC: Final = "02:00:a9:fe:11:01"
ACTOR_IFNAME: Final = "eth0"
VETH_PREFIX_HEAD: Final = "av"
NETNS_PREFIX_HEAD: Final = "ate-"


def _tag(value: str, length: int) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]


def worker_tag(worker_name: str) -> str:
    """Five hex characters naming the worker in interface and namespace names."""
    if not isinstance(worker_name, str) or not worker_name:
        raise InvalidArgument("worker name is required")
    return _tag(worker_name, 5)


def veth_prefix(worker_name: str) -> str:
    """The prefix of every host veth of ``worker_name``'s actors (``av`` + worker tag)."""
    return VETH_PREFIX_HEAD + worker_tag(worker_name)


def netns_prefix(worker_name: str) -> str:
    """The prefix of every actor namespace of ``worker_name``."""
    return f"{NETNS_PREFIX_HEAD}{worker_tag(worker_name)}-"


@attrs.frozen(slots=True, kw_only=True)
class ActorNetworkPlan:
    """One actor's namespace and veth on one worker."""

    netns: str
    host_veth: str
    actor_address: str = ACTOR_ADDRESS
    gateway_address: str = GATEWAY_ADDRESS
    prefix_len: int = PREFIX_LEN
    actor_ifname: str = ACTOR_IFNAME
    actor_mac: str = ACTOR_MAC
    gateway_mac: str = GATEWAY_MAC

    @property
    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.netns}"


def plan_for(worker_name: str, actor_uid: str) -> ActorNetworkPlan:
    """The network of actor ``actor_uid`` on worker ``worker_name``."""
    if not isinstance(actor_uid, str) or not actor_uid:
        raise InvalidArgument("actor uid is required")
    actor = _tag(actor_uid, 8)
    return ActorNetworkPlan(
        netns=f"{netns_prefix(worker_name)}{actor}",
        host_veth=f"{veth_prefix(worker_name)}{actor}",
    )


__all__ = [
    "ACTOR_ADDRESS",
    "ACTOR_IFNAME",
    "ACTOR_MAC",
    "GATEWAY_ADDRESS",
    "GATEWAY_MAC",
    "PREFIX_LEN",
    "ActorNetworkPlan",
    "netns_prefix",
    "plan_for",
    "veth_prefix",
    "worker_tag",
]
