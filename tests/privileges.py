"""Skip conditions for suites that need root, network namespaces, nftables or runsc.

They skip with the reason printed on a machine without them; ``.ci/run`` turns every
skip into a failure, so CI always runs them for real.
"""

from __future__ import annotations

import os
import shutil

import pytest


def _why_no_netns() -> str:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    return ""


def _why_no_nft() -> str:
    return _why_no_netns() or ("" if shutil.which("nft") else "needs nftables' nft")


def _why_no_runsc() -> str:
    return _why_no_netns() or ("" if shutil.which("runsc") else "needs gVisor's runsc")


NO_NETNS = _why_no_netns()
NO_NFT = _why_no_nft()
NO_RUNSC = _why_no_runsc()

needs_netns = pytest.mark.skipif(bool(NO_NETNS), reason=NO_NETNS or "netns available")
needs_nft = pytest.mark.skipif(bool(NO_NFT), reason=NO_NFT or "nft available")
needs_runsc = pytest.mark.skipif(bool(NO_RUNSC), reason=NO_RUNSC or "runsc available")
