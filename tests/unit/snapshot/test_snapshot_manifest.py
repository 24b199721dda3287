"""The manifest: canonical JSON, compatibility with the original fields, strict parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.core.model import Fidelity
from substrate.errors import InvalidArgument
from substrate.snapshot import FORMAT_VERSION, Asset, Manifest, ManifestFile

SHA_A = "a" * 64
SHA_B = "0123456789abcdef" * 4


def sample() -> Manifest:
    return Manifest(
        sandbox_class="gvisor",
        runtime_version="runsc-2022",
        assets={"runsc": Asset(url="https://assets.example/runsc", sha256=SHA_A)},
        files=(
            ManifestFile(name="checkpoint.img", size=4096, sha256=SHA_B),
            ManifestFile(name="pages.img", size=0, sha256=SHA_A),
        ),
        fidelity=Fidelity.MEMORY,
        created_at=1_700_000_000.25,
    )


def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(sample().to_bytes())
    return loaded


def encode(value: object) -> bytes:
    return json.dumps(value).encode()


def test_to_bytes_is_canonical_json_with_the_original_fields() -> None:
    data = sample().to_bytes()
    assert data == (
        b'{"assets":{"runsc":{"sha256":"' + SHA_A.encode() + b'",'
        b'"url":"https://assets.example/runsc"}},'
        b'"createdAt":1700000000.25,"fidelity":"MEMORY",'
        b'"files":[{"name":"checkpoint.img","sha256":"' + SHA_B.encode() + b'","size":4096},'
        b'{"name":"pages.img","sha256":"' + SHA_A.encode() + b'","size":0}],'
        b'"formatVersion":1,"runtimeVersion":"runsc-2022","sandboxClass":"gvisor",'
        b'"snapshotFiles":["checkpoint.img","pages.img"]}'
    )
    # What a reader of the original format looks at.
    original = json.loads(data)
    assert original["sandboxClass"] == "gvisor"
    assert original["assets"] == {"runsc": {"url": "https://assets.example/runsc", "sha256": SHA_A}}
    assert original["snapshotFiles"] == ["checkpoint.img", "pages.img"]


def test_round_trip_and_properties() -> None:
    m = sample()
    assert Manifest.from_bytes(m.to_bytes()) == m
    assert Manifest.from_bytes(bytearray(m.to_bytes())) == m
    assert m.file_names == ("checkpoint.img", "pages.img")
    assert m.total_size == 4096
    assert m.assets["runsc"].sha256 == SHA_A


def test_assets_are_immutable_and_order_independent() -> None:
    one = Asset(url="u1", sha256=SHA_A)
    two = Asset(url="u2", sha256=SHA_B)
    a = Manifest(sandbox_class="gvisor", assets={"b": two, "a": one})
    b = Manifest(sandbox_class="gvisor", assets={"a": one, "b": two})
    assert a == b
    assert a.to_bytes() == b.to_bytes()
    assert hash(a) == hash(b)
    with pytest.raises(TypeError):
        a.assets["c"] = one  # type: ignore[index]


def test_source_dict_is_copied() -> None:
    source = {"runsc": Asset(url="u", sha256=SHA_A)}
    m = Manifest(sandbox_class="gvisor", assets=source)
    source["other"] = Asset(url="v", sha256=SHA_B)
    assert list(m.assets) == ["runsc"]


def test_minimal_manifest() -> None:
    m = Manifest(sandbox_class="fake")
    assert Manifest.from_bytes(m.to_bytes()) == m
    assert json.loads(m.to_bytes())["snapshotFiles"] == []


def mutated(**changes: Any) -> bytes:
    d = doc()
    for key, value in changes.items():
        if value is _DELETE:
            del d[key]
        else:
            d[key] = value
    return encode(d)


_DELETE = object()

BAD_DOCUMENTS: list[tuple[str, bytes]] = [
    ("not json", b"{not json"),
    ("empty", b""),
    ("not utf-8", b"\xff\xfe{}"),
    ("not an object", b"[]"),
    ("null", b"null"),
    ("NaN", mutated().replace(b"1700000000.25", b"NaN")),
    ("duplicate key", b'{"sandboxClass":"a","sandboxClass":"b"}'),
    ("unknown field", mutated(extra=1)),
    ("missing formatVersion", mutated(formatVersion=_DELETE)),
    ("future formatVersion", mutated(formatVersion=2)),
    ("formatVersion as string", mutated(formatVersion="1")),
    ("missing sandboxClass", mutated(sandboxClass=_DELETE)),
    ("empty sandboxClass", mutated(sandboxClass="")),
    ("sandboxClass not a string", mutated(sandboxClass=3)),
    ("runtimeVersion not a string", mutated(runtimeVersion=None)),
    ("assets not an object", mutated(assets=[])),
    ("asset not an object", mutated(assets={"runsc": "x"})),
    ("asset missing sha256", mutated(assets={"runsc": {"url": "u"}})),
    ("asset extra field", mutated(assets={"runsc": {"url": "u", "sha256": SHA_A, "x": 1}})),
    ("asset short sha256", mutated(assets={"runsc": {"url": "u", "sha256": "ab"}})),
    ("asset upper-case sha256", mutated(assets={"runsc": {"url": "u", "sha256": "A" * 64}})),
    ("asset non-hex sha256", mutated(assets={"runsc": {"url": "u", "sha256": "g" * 64}})),
    ("asset empty url", mutated(assets={"runsc": {"url": "", "sha256": SHA_A}})),
    ("asset name with slash", mutated(assets={"a/b": {"url": "u", "sha256": SHA_A}})),
    ("snapshotFiles not a list", mutated(snapshotFiles="pages.img")),
    ("snapshotFiles differs", mutated(snapshotFiles=["pages.img", "checkpoint.img"])),
    ("files not a list", mutated(files={})),
    ("file not an object", mutated(files=["pages.img"], snapshotFiles=["pages.img"])),
    (
        "file name with slash",
        mutated(
            files=[{"name": "../x", "size": 1, "sha256": SHA_A}],
            snapshotFiles=["../x"],
        ),
    ),
    (
        "file name ..",
        mutated(files=[{"name": "..", "size": 1, "sha256": SHA_A}], snapshotFiles=[".."]),
    ),
    (
        "file name empty",
        mutated(files=[{"name": "", "size": 1, "sha256": SHA_A}], snapshotFiles=[""]),
    ),
    (
        "file name with directory",
        mutated(files=[{"name": "a/b", "size": 1, "sha256": SHA_A}], snapshotFiles=["a/b"]),
    ),
    (
        "duplicate file",
        mutated(
            files=[{"name": "p", "size": 1, "sha256": SHA_A}] * 2,
            snapshotFiles=["p", "p"],
        ),
    ),
    (
        "negative size",
        mutated(files=[{"name": "p", "size": -1, "sha256": SHA_A}], snapshotFiles=["p"]),
    ),
    (
        "bool size",
        mutated(files=[{"name": "p", "size": True, "sha256": SHA_A}], snapshotFiles=["p"]),
    ),
    (
        "float size",
        mutated(files=[{"name": "p", "size": 1.5, "sha256": SHA_A}], snapshotFiles=["p"]),
    ),
    (
        "file sha256 too long",
        mutated(files=[{"name": "p", "size": 1, "sha256": SHA_A + "0"}], snapshotFiles=["p"]),
    ),
    ("file missing size", mutated(files=[{"name": "p", "sha256": SHA_A}], snapshotFiles=["p"])),
    ("unknown fidelity", mutated(fidelity="EVERYTHING")),
    ("fidelity as number", mutated(fidelity=3)),
    ("createdAt as string", mutated(createdAt="now")),
    ("negative createdAt", mutated(createdAt=-1.0)),
    ("bool createdAt", mutated(createdAt=True)),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000),
]


@pytest.mark.parametrize("data", [pytest.param(d, id=i) for i, d in BAD_DOCUMENTS])
def test_from_bytes_rejects(data: bytes) -> None:
    with pytest.raises(InvalidArgument):
        Manifest.from_bytes(data)


def test_from_bytes_rejects_text() -> None:
    with pytest.raises(InvalidArgument, match="must be bytes"):
        Manifest.from_bytes("{}")  # type: ignore[arg-type]


def test_the_original_format_alone_is_not_enough() -> None:
    # Our reader needs the per-file sizes and digests; an original manifest lacks them.
    original = {
        "sandboxClass": "gvisor",
        "assets": {"runsc": {"url": "u", "sha256": SHA_A}},
        "snapshotFiles": ["pages.img"],
    }
    with pytest.raises(InvalidArgument):
        Manifest.from_bytes(encode(original))


def test_integer_created_at_is_accepted() -> None:
    m = Manifest.from_bytes(mutated(createdAt=17))
    assert m.created_at == 17.0
    assert isinstance(m.created_at, float)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Asset(url="u", sha256="xyz"),
        lambda: Asset(url="", sha256=SHA_A),
        lambda: ManifestFile(name="a/b", size=1, sha256=SHA_A),
        lambda: ManifestFile(name="..", size=1, sha256=SHA_A),
        lambda: ManifestFile(name="", size=1, sha256=SHA_A),
        lambda: ManifestFile(name="p", size=-1, sha256=SHA_A),
        lambda: Manifest(sandbox_class=""),
        lambda: Manifest(sandbox_class="g", created_at=float("nan")),
        lambda: Manifest(sandbox_class="g", assets={"../x": Asset(url="u", sha256=SHA_A)}),
        lambda: Manifest(
            sandbox_class="g",
            files=[ManifestFile(name="p", size=1, sha256=SHA_A)] * 2,
        ),
    ],
)
def test_constructors_validate(build: Any) -> None:
    with pytest.raises(InvalidArgument):
        build()


def test_format_version_constant() -> None:
    assert json.loads(sample().to_bytes())["formatVersion"] == FORMAT_VERSION == 1


# --- properties -------------------------------------------------------------------------

_FIRST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(_FIRST),
    st.text(alphabet=_FIRST + ".+-", max_size=30),
).filter(lambda s: ".." not in s)
shas = st.binary(min_size=32, max_size=32).map(bytes.hex)
manifests = st.builds(
    Manifest,
    sandbox_class=st.sampled_from(("gvisor", "microvm", "fake")),
    runtime_version=st.text(max_size=20),
    assets=st.dictionaries(
        names, st.builds(Asset, url=st.text(min_size=1, max_size=40), sha256=shas), max_size=3
    ),
    files=st.lists(
        st.builds(ManifestFile, name=names, size=st.integers(0, 2**62), sha256=shas),
        unique_by=lambda f: f.name,
        max_size=5,
    ),
    fidelity=st.sampled_from(Fidelity),
    created_at=st.floats(0, 1e12, allow_nan=False, allow_infinity=False),
)


@given(m=manifests)
def test_property_manifest_round_trips(m: Manifest) -> None:
    data = m.to_bytes()
    back = Manifest.from_bytes(data)
    assert back == m
    assert back.to_bytes() == data
    parsed = json.loads(data)
    assert parsed["snapshotFiles"] == list(m.file_names)
    assert list(parsed) == sorted(parsed)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


def parses_or_invalid(data: bytes) -> None:
    """Malformed input only ever raises InvalidArgument; valid input round-trips."""
    try:
        m = Manifest.from_bytes(data)
    except InvalidArgument:
        return  # any other exception type fails the test
    assert Manifest.from_bytes(m.to_bytes()) == m


@given(data=st.binary(max_size=200))
def test_property_garbage_bytes(data: bytes) -> None:
    parses_or_invalid(data)


@given(key=st.sampled_from([*sorted(doc()), "extra"]), value=json_values)
def test_property_any_field_value(key: str, value: object) -> None:
    d = doc()
    d[key] = value
    parses_or_invalid(encode(d))
    files = doc()
    files["files"] = [{"name": "p", "size": 1, "sha256": SHA_A, **{key: value}}]
    files["snapshotFiles"] = ["p"]
    parses_or_invalid(encode(files))
