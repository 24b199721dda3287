"""Every Store case against every Store adapter (ids like ``[memory-case_actor_...]``)."""

from __future__ import annotations

import pytest

from substrate.testing.contracts.store import STORE_CASES, MakeStore, StoreCase


@pytest.mark.anyio
@pytest.mark.parametrize("case", STORE_CASES, ids=lambda case: case.__name__)
async def test_store_contract(case: StoreCase, make_store: MakeStore) -> None:
    await case(make_store)
