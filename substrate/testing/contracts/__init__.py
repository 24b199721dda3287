"""Conformance suites: pytest-free cases every adapter of a port must pass."""

from substrate.testing.contracts.store import STORE_CASES, MakeStore, StoreCase, StoreFactory

__all__ = ["STORE_CASES", "MakeStore", "StoreCase", "StoreFactory"]
