"""In-memory adapters: the embedded default and the reference model for the conformance suites."""

from substrate.adapters.memory.blobstore import InMemoryBlobStore
from substrate.adapters.memory.clock import ManualClock
from substrate.adapters.memory.network import FakeHostNetwork
from substrate.adapters.memory.sandbox import FakeSandboxRuntime
from substrate.adapters.memory.store import MemoryStore, MemoryStoreState

__all__ = [
    "FakeHostNetwork",
    "FakeSandboxRuntime",
    "InMemoryBlobStore",
    "ManualClock",
    "MemoryStore",
    "MemoryStoreState",
]
