"""Names, references and model validation."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrate.core.ids import ActorRef, Labels, TemplateRef, validate_dns_label, validate_selector
from substrate.core.model import (
    ActorTemplate,
    Capacity,
    Container,
    Probe,
    Resources,
    Snapshot,
    SnapshotStorage,
)
from substrate.errors import InvalidArgument
from substrate.testing import strategies as sst


@given(sst.dns_labels())
def test_valid_labels_pass(name: str) -> None:
    assert validate_dns_label(name, what="actor name") == name


@given(sst.invalid_dns_labels())
def test_invalid_labels_raise_invalid_argument_naming_the_field(name: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_dns_label(name, what="actor name")
    assert "actor name" in info.value.description


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "must have the form"),
        ("noslash", "must have the form"),
        ("a/b/c", "must have the form"),
        ("/b", "atespace is required"),
        ("a/", "actor name is required"),
        ("A/b", "atespace 'A' is invalid"),
        ("a/b_c", "actor name 'b_c' is invalid"),
        ("a/" + "x" * 64, "no more than 63 characters"),
    ],
)
def test_actor_ref_parse_errors(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ActorRef.parse(text)


@given(sst.actor_refs())
def test_actor_ref_round_trips_through_its_header_form(ref: ActorRef) -> None:
    assert ActorRef.parse(str(ref)) == ref
    assert ref.lease_key == f"lease:actor:{ref.atespace}:{ref.name}"


def test_same_name_in_two_atespaces_are_different_actors() -> None:
    a, b = ActorRef(atespace="x", name="n"), ActorRef(atespace="y", name="n")
    assert a != b and a.lease_key != b.lease_key


def test_selector_limits_and_label_syntax() -> None:
    validate_selector(Labels({f"k{i}": "v" for i in range(10)}))
    with pytest.raises(InvalidArgument, match="more than the limit of 10"):
        validate_selector(Labels({f"k{i}": "v" for i in range(11)}))
    with pytest.raises(InvalidArgument, match="label key"):
        validate_selector(Labels({"bad key": "v"}))
    with pytest.raises(InvalidArgument, match="value"):
        validate_selector(Labels({"k": "-bad"}))
    validate_selector(Labels({"example.com/zone": "a_b.c"}))


@given(sst.labels(), sst.labels())
def test_selector_matching_is_subset_semantics(sel: Labels, have: Labels) -> None:
    expected = all(have.as_dict().get(k) == v for k, v in sel)
    assert sel.matches(have) is expected
    assert Labels().matches(have)
    assert have.matches(have)


@given(sst.capacities(), sst.resources())
def test_capacity_plus_minus_round_trip_and_never_negative(c: Capacity, r: Resources) -> None:
    assert c.plus(r).minus(r) == c
    low = Capacity().minus(r)
    assert low.cpu_milli >= 0 and low.memory_bytes >= 0 and low.actors >= 0


def test_negative_resources_are_invalid() -> None:
    with pytest.raises(InvalidArgument, match="cpu_milli must not be negative"):
        Resources(cpu_milli=-1)


def test_template_validation_messages() -> None:
    ok = ActorTemplate(
        ref=TemplateRef(atespace="a", name="t"),
        containers=(Container(name="app", image="local/app", wakeup_probe=Probe(path="/readyz")),),
    )
    assert ok.validate() is ok
    with pytest.raises(InvalidArgument, match="at least one container"):
        attrs.evolve(ok, containers=()).validate()
    with pytest.raises(InvalidArgument, match="reserved"):
        attrs.evolve(ok, containers=(Container(name="pause", image="x"),)).validate()
    with pytest.raises(InvalidArgument, match="duplicate container"):
        attrs.evolve(ok, containers=(ok.containers[0], ok.containers[0])).validate()
    with pytest.raises(InvalidArgument, match="timeout_seconds"):
        attrs.evolve(
            ok,
            containers=(Container(name="a", image="x", wakeup_probe=Probe(timeout_seconds=0)),),
        ).validate()
    with pytest.raises(InvalidArgument, match="port 70000"):
        attrs.evolve(ok, containers=(Container(name="a", image="x", ports=(70000,)),)).validate()


@given(sst.templates())
def test_generated_templates_validate(t: ActorTemplate) -> None:
    t.validate()


@settings(max_examples=30)
@given(sst.actors())
def test_generated_actors_validate(a: object) -> None:
    from substrate.core.model import Actor

    assert isinstance(a, Actor)
    a.validate()


@settings(max_examples=50)
@given(sst.snapshots(), sst.storages())
def test_with_storage_replaces_the_copy_of_the_same_durability(
    snap: Snapshot, storage: SnapshotStorage
) -> None:
    out = snap.with_storage(storage)
    same = [s for s in out.storages if s.durability is storage.durability]
    assert same == [storage]
    assert len(out.storages) == len({s.durability for s in out.storages})
    assert out.without(storage.durability).storages == tuple(
        s for s in out.storages if s.durability is not storage.durability
    )


@settings(max_examples=20)
@given(st.data())
def test_records_are_frozen(data: st.DataObject) -> None:
    actor = data.draw(sst.actors())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        actor.ref = ActorRef(atespace="x", name="y")  # type: ignore[misc]
