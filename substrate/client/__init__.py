"""substrate's Python SDK: typed calls to ateapi's Control API over mutual TLS.

.. code-block:: python

    async with AteClient.connect("127.0.0.1:7443", tls_dir="~/.ate/tls") as ate:
        actor = await ate.create_actor("lab/a1", template="lab/counter")
        result = await ate.resume_actor(actor.ref)

Results are :mod:`substrate.core.model` records and failures are :mod:`substrate.errors`
classes. :class:`SyncAteClient` is the blocking twin for scripts.

The local stack (``ate up``): :func:`connect_local` / :func:`connect_local_sync` open a
client with the files in its state directory, :func:`read_local_stack` tells its
endpoints, and :func:`call_actor` sends an HTTP request to an actor through the router
(the ``ate-target-actor`` header), returning the status, headers (restore provenance
included) and body. :func:`load_template` reads a template file (YAML or JSON).
"""

from substrate.client._async import DEFAULT_TIMEOUT, DEFAULT_TLS_NAME, AteClient, parse_address
from substrate.client._sync import SyncAteClient
from substrate.client.http import ActorResponse, call_actor, call_actor_sync
from substrate.client.local import (
    LocalStack,
    connect_local,
    connect_local_sync,
    default_state_dir,
    read_local_stack,
)
from substrate.client.manifest import load_template, parse_template

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_TLS_NAME",
    "ActorResponse",
    "AteClient",
    "LocalStack",
    "SyncAteClient",
    "call_actor",
    "call_actor_sync",
    "connect_local",
    "connect_local_sync",
    "default_state_dir",
    "load_template",
    "parse_address",
    "parse_template",
    "read_local_stack",
]
