"""The Postgres adapter's JSON codec: exact round trip of every stored record type."""

from __future__ import annotations

import enum
import json
from typing import Any

import attrs
import pytest
from hypothesis import given

from substrate.adapters.postgres.codec import Codec
from substrate.core.ids import Labels
from substrate.core.model import (
    Actor,
    ActorBinding,
    ActorState,
    ActorTemplate,
    Atespace,
    Capacity,
    Fidelity,
    Tag,
    Worker,
)
from substrate.errors import Internal, InvalidArgument
from substrate.testing.contracts.store import full_actor, full_template, full_worker
from tests.adapters import model_strategies as ms


def round_trip(value: object) -> object:
    codec = Codec()
    text = codec.dumps(value)
    return codec.loads(type(value), text)


@given(ms.actors)
def test_actor_round_trips(actor: Actor) -> None:
    assert round_trip(actor) == actor


@given(ms.workers)
def test_worker_round_trips(worker: Worker) -> None:
    assert round_trip(worker) == worker


@given(ms.templates)
def test_template_round_trips(template: ActorTemplate) -> None:
    assert round_trip(template) == template


@given(ms.tags)
def test_tag_round_trips(tag: Tag) -> None:
    assert round_trip(tag) == tag


@given(ms.atespaces)
def test_atespace_round_trips(atespace: Atespace) -> None:
    assert round_trip(atespace) == atespace


@given(ms.bindings)
def test_binding_round_trips(binding: ActorBinding) -> None:
    assert round_trip(binding) == binding


def test_documents_are_readable_json() -> None:
    doc = json.loads(Codec().dumps(full_worker()))
    assert doc["ref"] == {"name": "w-rich"}
    assert doc["state"] == "DRAINING"
    assert doc["labels"] == [["tier", ""], ["zone", "b"]]
    assert doc["runtime_versions"] == ["runsc-2022", "runsc-2024"]
    assert doc["capacity"] == {"cpu_milli": 16000, "memory_bytes": 64 << 30, "actors": 40}
    actor_doc = json.loads(Codec().dumps(full_actor()))
    assert actor_doc["status"]["snapshots"][0]["storages"][0]["fidelity"] == "MEMORY"
    assert json.loads(Codec().dumps(full_template()))["sandbox_class"] == "FAKE"


def test_missing_fields_take_defaults_and_unknown_fields_are_ignored() -> None:
    codec = Codec()
    doc = json.loads(codec.dumps(full_actor()))
    del doc["status"]["crash"]
    del doc["worker_selector"]
    doc["added_in_a_later_release"] = {"x": 1}
    loaded = codec.from_json(Actor, doc)
    assert loaded.status.crash is None
    assert loaded.worker_selector == Labels()
    assert loaded == attrs.evolve(
        full_actor(),
        worker_selector=Labels(),
        status=attrs.evolve(full_actor().status, crash=None),
    )


def test_numbers_are_coerced_by_annotation() -> None:
    codec = Codec()
    doc = json.loads(codec.dumps(full_worker()))
    doc["last_heartbeat"] = 10**16  # jsonb prints an integral float without a fraction
    doc["epoch"] = 7.0
    loaded = codec.from_json(Worker, doc)
    assert loaded.last_heartbeat == 1e16
    assert isinstance(loaded.last_heartbeat, float)
    assert loaded.epoch == 7
    assert isinstance(loaded.epoch, int)


@pytest.mark.parametrize(
    ("cls", "doc"),
    [
        (Actor, {"ref": {"atespace": "a"}}),
        (Actor, []),
        (Worker, {"ref": {"name": "w"}, "node": {"name": "n"}, "state": "BOGUS"}),
        (Worker, {"ref": {"name": "w"}, "node": {"name": "n"}, "epoch": "7"}),
        (Worker, {"ref": {"name": "w"}, "node": {"name": "n"}, "epoch": 1.5}),
        (Worker, {"ref": {"name": "w"}, "node": {"name": "n"}, "labels": [["k"]]}),
        (Worker, {"ref": {"name": "w"}, "node": {"name": "n"}, "allocated": {"actors": -1}}),
        (Capacity, {"actors": True}),
    ],
)
def test_malformed_documents_are_internal_errors(cls: type, doc: Any) -> None:
    with pytest.raises(Internal, match="malformed"):
        Codec().from_json(cls, doc)


def test_non_finite_numbers_are_refused() -> None:
    worker = attrs.evolve(full_worker(), last_heartbeat=float("nan"))
    with pytest.raises(InvalidArgument, match="non-finite"):
        Codec().dumps(worker)


def test_enums_are_stored_by_name() -> None:
    codec = Codec()
    assert codec.to_json(ActorState.DELETING) == "DELETING"
    assert codec.to_json(Fidelity.ROOTFS) == "ROOTFS"
    assert codec.from_json(Fidelity, "ROOTFS") is Fidelity.ROOTFS


def reference_to_json(value: object) -> object:
    """The value-by-value encoding the store has always written (the compiled codec must
    produce exactly this, so documents already stored and new ones are alike)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int | float):
        return value
    if isinstance(value, Labels):
        return [[k, v] for k, v in value.items]
    if isinstance(value, frozenset):
        return sorted((reference_to_json(v) for v in value), key=json.dumps)
    if isinstance(value, tuple | list):
        return [reference_to_json(v) for v in value]
    assert attrs.has(type(value))
    return {f.name: reference_to_json(getattr(value, f.name)) for f in attrs.fields(type(value))}


@given(ms.records)
def test_the_stored_format_is_unchanged(record: object) -> None:
    codec = Codec()
    expected = reference_to_json(record)
    assert codec.to_json(record) == expected
    assert codec.dumps(record) == json.dumps(expected, separators=(",", ":"), allow_nan=False)


def test_values_off_their_annotation_encode_as_before() -> None:
    """The compiled fast paths are only taken for values of exactly the annotated type."""
    odd = attrs.evolve(full_worker(), last_heartbeat=7, epoch=True)  # int for float, bool
    assert Codec().to_json(odd) == reference_to_json(odd)
    assert json.loads(Codec().dumps(odd))["last_heartbeat"] == 7
