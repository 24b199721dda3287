"""substrate's Python SDK: typed calls to ateapi's Control API over mutual TLS.

.. code-block:: python

    async with AteClient.connect("127.0.0.1:7443", tls_dir="~/.ate/tls") as ate:
        actor = await ate.create_actor("lab/a1", template="lab/counter")
        result = await ate.resume_actor(actor.ref)

Results are :mod:`substrate.core.model` records and failures are :mod:`substrate.errors`
classes. :class:`SyncAteClient` is the blocking twin for scripts.
"""

from substrate.client._async import DEFAULT_TIMEOUT, DEFAULT_TLS_NAME, AteClient, parse_address
from substrate.client._sync import SyncAteClient

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_TLS_NAME", "AteClient", "SyncAteClient", "parse_address"]
