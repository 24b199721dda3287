"""Linux adapters: actor network namespaces (netlink) and the egress table (nftables)."""

from substrate.adapters.linux.netlink import LinuxHostNetwork
from substrate.adapters.linux.nftables import Nftables

__all__ = ["LinuxHostNetwork", "Nftables"]
