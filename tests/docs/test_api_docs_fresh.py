"""docs/api.md is rendered from the protos' comments and must not go stale."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_api", ROOT / "scripts/render_api_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_api_docs = _renderer()


def test_rendered_api_reference_is_fresh() -> None:
    expected = render_api_docs.render()
    actual = (ROOT / "docs/api.md").read_text(encoding="utf-8")
    assert actual == expected, (
        "docs/api.md is stale: run `python scripts/render_api_docs.py > docs/api.md`"
    )


def test_every_service_rpc_message_and_enum_is_documented() -> None:
    files = render_api_docs.proto_files()
    text = (ROOT / "docs/api.md").read_text(encoding="utf-8")
    assert {f.path.rsplit("/", 1)[-1] for f in files} >= {
        "control.proto",
        "types.proto",
        "registry.proto",
        "atelet.proto",
        "worker.proto",
    }
    services = {s.name: s for f in files for s in f.services}
    assert set(services) == {"Control", "WorkerRegistry", "Atelet", "Ateworker"}
    assert "ResumeActor" in {r.name for r in services["Control"].rpcs}
    for f in files:
        for service in f.services:
            assert service.comment, f"service {service.name} has no comment"
            assert f"### service `{service.name}`" in text
            for rpc in service.rpcs:
                assert rpc.comment, f"{service.name}.{rpc.name} has no comment"
                assert f"| `{rpc.name}` |" in text
        for message in f.messages:
            assert message.comment, f"message {message.name} has no comment"
            assert f"#### `{message.name}`" in text
        for enum in f.enums:
            assert f"#### enum `{enum.name}`" in text
    # Every link points at an anchor of the page.
    anchors = {line.split('"')[1] for line in text.splitlines() if line.startswith("<a id=")}
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, target


SAMPLE = """\
// The header.
syntax = "proto3";

package demo.v2;

import "google/protobuf/empty.proto";
option go_package = "x/y";

// --- a detached section comment ---

// A service.
service Things {
  option deprecated = true;
  // Streams things.
  rpc Watch(stream Query) returns (stream Thing) {
    option idempotency_level = NO_SIDE_EFFECTS;
  }
  rpc Get(Query) returns (Thing);  // Gets one thing.
}

// What to look for.
message Query {
  // The name; may contain '|' bars.
  string name = 1;
  reserved 2, 3;
  reserved "old";
  oneof pick {
    // By id.
    int64 id = 4;
    Thing.Kind kind = 5 [deprecated = true];
  }
  map<string, Thing> by_name = 6;
}

// A thing.
message Thing {
  // Its kind.
  enum Kind {
    KIND_UNSPECIFIED = 0;
    // Big.
    KIND_BIG = 1;
  }
  Kind kind = 1;
  repeated Thing children = 2;
  optional Inner inner = 3;
  // Nested.
  message Inner {}
}
"""


def test_parser_handles_the_proto3_subset(tmp_path: Path) -> None:
    (tmp_path / "substrate/v1").mkdir(parents=True)
    (tmp_path / "substrate/v1/demo.proto").write_text(SAMPLE)
    (f,) = render_api_docs.proto_files(tmp_path)
    assert (f.path, f.package, f.comment) == ("substrate/v1/demo.proto", "demo.v2", "The header.")
    assert f.imports == ("google/protobuf/empty.proto",)
    (service,) = f.services
    assert service.comment == "A service."
    watch, get = service.rpcs
    assert (watch.client_streaming, watch.server_streaming, watch.comment) == (
        True,
        True,
        "Streams things.",
    )
    assert (get.request, get.response, get.comment) == ("Query", "Thing", "Gets one thing.")
    messages = {m.full_name: m for m in f.messages}
    assert set(messages) == {"demo.v2.Query", "demo.v2.Thing", "demo.v2.Thing.Inner"}
    query = messages["demo.v2.Query"]
    assert [(x.name, x.number, x.label, x.oneof) for x in query.fields] == [
        ("name", 1, "", ""),
        ("id", 4, "", "pick"),
        ("kind", 5, "", "pick"),
        ("by_name", 6, "map", ""),
    ]
    assert query.reserved == ("2, 3", '"old"')
    assert query.fields[1].comment == "By id."
    (enum,) = f.enums
    assert enum.full_name == "demo.v2.Thing.Kind"
    assert [(v.name, v.comment) for v in enum.values] == [
        ("KIND_UNSPECIFIED", ""),
        ("KIND_BIG", "Big."),
    ]
    text = render_api_docs.render(tmp_path)
    assert "detached" not in text
    assert "The name; may contain '\\|' bars." in text
    assert (
        "| `Watch` | stream [`Query`](#demo-v2-query) | stream [`Thing`](#demo-v2-thing) |" in text
    )
    assert "#### enum `Thing.Kind`" in text
    assert "| `kind` | 1 | [`Thing.Kind`](#demo-v2-thing-kind) |" in text
    assert "| `inner` | 3 | optional [`Thing.Inner`](#demo-v2-thing-inner) |" in text
    assert "`map<string, `[`Thing`](#demo-v2-thing)`>`" in text


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "substrate/v1").mkdir(parents=True)
    (tmp_path / "substrate/v1/bad.proto").write_text('syntax = "proto3";\n\nmessage M {\n  @\n}\n')
    with pytest.raises(render_api_docs.ProtoSyntaxError, match=r"bad\.proto:4"):
        render_api_docs.proto_files(tmp_path)
