"""Linux adapters (netlink, nftables): behaviour outside the port contract."""
