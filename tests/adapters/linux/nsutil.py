"""Test helpers: sockets made inside a network namespace, and system observation."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import threading

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def socket_in_netns(netns_path: str, family: int = socket.AF_INET) -> socket.socket:
    """A TCP socket that lives in the namespace at ``netns_path`` (made by a thread there)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, os.strerror(code))
            finally:
                os.close(fd)
            made.append(socket.socket(family, socket.SOCK_STREAM))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


def ip_json(*argv: str) -> list[dict[str, object]]:
    done = subprocess.run(["ip", "-j", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return []
    found: list[dict[str, object]] = json.loads(done.stdout)
    return found


def netns_names() -> list[str]:
    return [str(ns["name"]) for ns in ip_json("netns", "list")]


def link_names() -> list[str]:
    return [str(link["ifname"]) for link in ip_json("link", "show")]


def nft_tables() -> list[str]:
    done = subprocess.run(
        ["nft", "-j", "list", "tables"], capture_output=True, text=True, check=True
    )
    return [
        t["table"]["name"]
        for t in json.loads(done.stdout)["nftables"]
        if "table" in t and t["table"]["family"] == "ip"
    ]


def run(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, check=False, timeout=10)


def cleanup(netns_prefix: str, veth_prefix: str, table_prefix: str = "") -> None:
    """Remove, by exact name, the namespaces, links and tables with these prefixes."""
    for name in link_names():
        if name.startswith(veth_prefix):
            run("ip", "link", "del", name)
    for name in netns_names():
        if name.startswith(netns_prefix):
            run("ip", "netns", "del", name)
    if table_prefix:
        for table in nft_tables():
            if table.startswith(table_prefix):
                run("nft", "delete", "table", "ip", table)


def leftovers(netns_prefix: str, veth_prefix: str, table_prefix: str = "") -> list[str]:
    found = [n for n in netns_names() if n.startswith(netns_prefix)]
    found += [v for v in link_names() if v.startswith(veth_prefix)]
    if table_prefix:
        found += [t for t in nft_tables() if t.startswith(table_prefix)]
    return found
