"""A fake node agent served over mTLS in a process of its own (for "the atelet died").

``python -m tests.api.atelet_process <tls-dir> <bundle> <node> <worker>...`` serves a
:class:`~substrate.testing.fake_node.FakeNodeAgent` of ``<node>`` with ``serve_atelet`` on
127.0.0.1 (a free port) using ``<tls-dir>/<bundle>.crt``; it prints the port on one line,
then serves until it is killed.
"""

from __future__ import annotations

import sys

import anyio

from substrate.api.atelet import serve_atelet
from substrate.core.ids import NodeRef, WorkerRef
from substrate.identity import TlsFiles, server_context
from substrate.testing.fake_node import FakeBucket, FakeNodeAgent

from .mtls_stack import TRUST_DOMAIN


async def serve(tls_dir: str, bundle: str, node: str, workers: list[str]) -> None:
    agent = FakeNodeAgent(NodeRef(node), FakeBucket(), [WorkerRef(w) for w in workers])
    ctx = server_context(TlsFiles.in_dir(tls_dir, bundle))
    async with serve_atelet(agent, "127.0.0.1", 0, ssl=ctx, trust_domain=TRUST_DOMAIN) as srv:
        sys.stdout.write(f"{srv.port}\n")
        sys.stdout.flush()
        await anyio.sleep_forever()


def main(argv: list[str]) -> None:
    tls_dir, bundle, node, *workers = argv
    anyio.run(serve, tls_dir, bundle, node, workers)


if __name__ == "__main__":
    main(sys.argv[1:])
