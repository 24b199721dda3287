"""Render docs/api.md, the API reference, from the protos' comments.

Usage: python scripts/render_api_docs.py > docs/api.md

Reads ``proto/substrate/v1/*.proto`` with a small parser of the proto3 subset the
project writes (syntax, package, import, option, enum, message with nested messages and
enums, oneof, map, optional/repeated fields, reserved, service with rpc) and renders every
service, RPC, message, field, enum and value with its leading comment (the ``//`` lines
right above it, as protoc defines them; a comment after a blank line is detached and
ignored), or its trailing comment (after the ``;`` on the same line) when it has none.
``tests/docs/test_api_docs_fresh.py`` fails when docs/api.md is stale.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import attrs

ROOT: Final = Path(__file__).resolve().parents[1]
PROTO_DIR: Final = ROOT / "proto"
PROTO_GLOB: Final = "substrate/v1/*.proto"
# The public API first, then the records, then the internal services in call order.
FILE_ORDER: Final = (
    "control.proto",
    "types.proto",
    "registry.proto",
    "atelet.proto",
    "worker.proto",
)
SCALARS: Final = frozenset(
    {
        "double",
        "float",
        "int32",
        "int64",
        "uint32",
        "uint64",
        "sint32",
        "sint64",
        "fixed32",
        "fixed64",
        "sfixed32",
        "sfixed64",
        "bool",
        "string",
        "bytes",
    }
)
_TOKEN_RE: Final = re.compile(
    r"""
    (?P<comment>//[^\n]*)
  | (?P<block>/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*|-?[0-9][A-Za-z0-9_.+-]*)
  | (?P<symbol>[{}()\[\]<>;=,:])
  | (?P<space>\s+)
    """,
    re.VERBOSE | re.DOTALL,
)


class ProtoSyntaxError(Exception):
    """A proto file this parser does not understand."""


# --- the model ------------------------------------------------------------------------------


@attrs.frozen
class Field:
    name: str
    number: int
    type: str
    label: str  # "", "optional", "repeated", "map"
    key_type: str = ""
    oneof: str = ""
    comment: str = ""


@attrs.frozen
class EnumValue:
    name: str
    number: int
    comment: str = ""


@attrs.frozen
class Enum:
    full_name: str
    name: str
    values: tuple[EnumValue, ...]
    comment: str = ""


@attrs.frozen
class Message:
    full_name: str
    name: str
    fields: tuple[Field, ...]
    reserved: tuple[str, ...] = ()
    comment: str = ""


@attrs.frozen
class Rpc:
    name: str
    request: str
    response: str
    client_streaming: bool = False
    server_streaming: bool = False
    comment: str = ""


@attrs.frozen
class Service:
    full_name: str
    name: str
    rpcs: tuple[Rpc, ...]
    comment: str = ""


@attrs.frozen
class ProtoFile:
    path: str
    package: str
    comment: str
    imports: tuple[str, ...]
    services: tuple[Service, ...]
    messages: tuple[Message, ...]
    enums: tuple[Enum, ...]


# --- tokens and comments ----------------------------------------------------------------------


@attrs.frozen
class Token:
    text: str
    line: int


class Tokens:
    """The tokens of one file, with the comments that lead or trail each declaration."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self.tokens: list[Token] = []
        self.comment_lines: dict[int, str] = {}  # whole-line comments
        self.trailing: dict[int, str] = {}  # comments after code on the same line
        code_lines: set[int] = set()
        pos, line = 0, 1
        while pos < len(text):
            match = _TOKEN_RE.match(text, pos)
            if match is None:
                raise ProtoSyntaxError(f"{path}:{line}: unexpected {text[pos]!r}")
            kind, value = match.lastgroup, match.group()
            if kind == "comment":
                body = value[2:]
                body = body[1:] if body.startswith(" ") else body
                if line in code_lines:
                    self.trailing[line] = body.rstrip()
                else:
                    self.comment_lines[line] = body.rstrip()
            elif kind in ("string", "word", "symbol"):
                self.tokens.append(Token(value, line))
                code_lines.add(line)
            line += value.count("\n")
            pos = match.end()
        self.i = 0

    def peek(self, ahead: int = 0) -> str:
        j = self.i + ahead
        return self.tokens[j].text if j < len(self.tokens) else ""

    def next(self) -> Token:
        if self.i >= len(self.tokens):
            raise ProtoSyntaxError(f"{self.path}: unexpected end of file")
        token = self.tokens[self.i]
        self.i += 1
        return token

    def expect(self, text: str) -> Token:
        token = self.next()
        if token.text != text:
            raise ProtoSyntaxError(f"{self.path}:{token.line}: want {text!r}, got {token.text!r}")
        return token

    def leading(self, line: int) -> str:
        """The comment lines directly above ``line`` (no blank line in between)."""
        lines: list[str] = []
        n = line - 1
        while n in self.comment_lines:
            lines.append(self.comment_lines[n])
            n -= 1
        return "\n".join(reversed(lines)).strip("\n")

    def comment(self, start: int, end: int) -> str:
        return self.leading(start) or self.trailing.get(end, "")

    def skip_statement(self) -> Token:
        """Up to and including the ``;`` (options, reserved, imports); returns the ``;``."""
        depth = 0
        while True:
            token = self.next()
            if token.text in "[({":
                depth += 1
            elif token.text in "])}":
                depth -= 1
            elif token.text == ";" and depth == 0:
                return token

    def skip_block(self) -> None:
        """A ``{ ... }`` block (rpc options)."""
        self.expect("{")
        depth = 1
        while depth:
            text = self.next().text
            depth += {"{": 1, "}": -1}.get(text, 0)


# --- the parser -----------------------------------------------------------------------------------


def _words_until_semicolon(t: Tokens) -> tuple[list[str], Token]:
    words: list[str] = []
    while t.peek() != ";":
        words.append(t.next().text)
    return words, t.next()


def parse_enum(t: Tokens, scope: str) -> Enum:
    start = t.expect("enum")
    name = t.next().text
    t.expect("{")
    values: list[EnumValue] = []
    while t.peek() != "}":
        if t.peek() in ("option", "reserved"):
            t.skip_statement()
            continue
        first = t.next()
        t.expect("=")
        number = int(t.next().text, 0)
        end = t.skip_statement() if t.peek() != ";" else t.next()
        values.append(EnumValue(first.text, number, t.comment(first.line, end.line)))
    t.expect("}")
    if t.peek() == ";":
        t.next()
    return Enum(f"{scope}.{name}", name, tuple(values), t.leading(start.line))


def _field(t: Tokens, oneof: str = "") -> Field:
    first = t.tokens[t.i]
    label = ""
    key_type = ""
    if t.peek() in ("optional", "repeated", "required"):
        label = t.next().text
    if t.peek() == "map":
        t.next()
        t.expect("<")
        key_type = t.next().text
        t.expect(",")
        type_ = t.next().text
        t.expect(">")
        label = "map"
    else:
        type_ = t.next().text
    name = t.next().text
    t.expect("=")
    number = int(t.next().text, 0)
    end = t.skip_statement() if t.peek() != ";" else t.next()
    return Field(
        name=name,
        number=number,
        type=type_,
        label=label,
        key_type=key_type,
        oneof=oneof,
        comment=t.comment(first.line, end.line),
    )


def parse_message(t: Tokens, scope: str, out: list[Message], enums: list[Enum]) -> None:
    start = t.expect("message")
    name = t.next().text
    full = f"{scope}.{name}"
    t.expect("{")
    fields: list[Field] = []
    reserved: list[str] = []
    nested: list[Message] = []
    while t.peek() != "}":
        word = t.peek()
        if word == "message":
            parse_message(t, full, nested, enums)
        elif word == "enum":
            enums.append(parse_enum(t, full))
        elif word == "option":
            t.skip_statement()
        elif word == "reserved":
            t.next()
            words, _ = _words_until_semicolon(t)
            reserved.append(" ".join(words).replace(" ,", ","))
        elif word == "oneof":
            t.next()
            group = t.next().text
            t.expect("{")
            while t.peek() != "}":
                if t.peek() == "option":
                    t.skip_statement()
                else:
                    fields.append(_field(t, oneof=group))
            t.expect("}")
        elif word == ";":
            t.next()
        else:
            fields.append(_field(t))
    t.expect("}")
    out.append(Message(full, name, tuple(fields), tuple(reserved), t.leading(start.line)))
    out.extend(nested)


def _rpc_type(t: Tokens) -> tuple[bool, str]:
    """``( [stream] Type )`` → (streaming, type)."""
    t.expect("(")
    streaming = t.peek() == "stream"
    if streaming:
        t.next()
    name = t.next().text
    t.expect(")")
    return streaming, name


def parse_service(t: Tokens, scope: str) -> Service:
    start = t.expect("service")
    name = t.next().text
    t.expect("{")
    rpcs: list[Rpc] = []
    while t.peek() != "}":
        if t.peek() == "option":
            t.skip_statement()
            continue
        first = t.expect("rpc")
        rpc_name = t.next().text
        client_streaming, request = _rpc_type(t)
        t.expect("returns")
        server_streaming, response = _rpc_type(t)
        end = t.tokens[t.i - 1]
        if t.peek() == "{":
            t.skip_block()
        else:
            end = t.expect(";")
        rpcs.append(
            Rpc(
                rpc_name,
                request,
                response,
                client_streaming,
                server_streaming,
                t.comment(first.line, end.line),
            )
        )
    t.expect("}")
    return Service(f"{scope}.{name}", name, tuple(rpcs), t.leading(start.line))


def parse_file(path: Path, relative: str) -> ProtoFile:
    t = Tokens(path.read_text(encoding="utf-8"), relative)
    package = ""
    header = ""
    imports: list[str] = []
    services: list[Service] = []
    messages: list[Message] = []
    enums: list[Enum] = []
    while t.i < len(t.tokens):
        word = t.peek()
        if word == "syntax":
            header = t.leading(t.tokens[t.i].line)
            t.skip_statement()
        elif word == "package":
            t.next()
            package = t.next().text
            t.expect(";")
        elif word == "import":
            t.next()
            words, _ = _words_until_semicolon(t)
            imports.append(words[-1].strip("\"'"))
        elif word == "option":
            t.skip_statement()
        elif word == "enum":
            enums.append(parse_enum(t, package))
        elif word == "message":
            parse_message(t, package, messages, enums)
        elif word == "service":
            services.append(parse_service(t, package))
        elif word == ";":
            t.next()
        else:
            token = t.next()
            raise ProtoSyntaxError(f"{relative}:{token.line}: unexpected {token.text!r}")
    return ProtoFile(
        relative, package, header, tuple(imports), tuple(services), tuple(messages), tuple(enums)
    )


def proto_files(proto_dir: Path = PROTO_DIR) -> list[ProtoFile]:
    paths = sorted(proto_dir.glob(PROTO_GLOB))
    rank = {name: i for i, name in enumerate(FILE_ORDER)}
    paths.sort(key=lambda p: (rank.get(p.name, len(FILE_ORDER)), p.name))
    return [parse_file(p, p.relative_to(proto_dir).as_posix()) for p in paths]


# --- rendering ----------------------------------------------------------------------------------


def _anchor(full_name: str) -> str:
    return full_name.replace(".", "-").replace("/", "-").lower()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "—"


def _paragraphs(text: str) -> list[str]:
    return [text, ""] if text else []


class Renderer:
    def __init__(self, files: list[ProtoFile]) -> None:
        self.files = files
        self.known: dict[str, str] = {}  # short and full names → full name
        for f in files:
            names = [m.full_name for m in f.messages] + [e.full_name for e in f.enums]
            self.known.update((name, name) for name in names)
        for full in list(self.known):
            self.known.setdefault(full.rsplit(".", 1)[-1], full)

    def local_name(self, full_name: str) -> str:
        """``substrate.v1.Outer.Inner`` → ``Outer.Inner`` (the name inside its package)."""
        for f in self.files:
            if full_name.startswith(f"{f.package}."):
                return full_name[len(f.package) + 1 :]
        return full_name

    def resolve(self, type_name: str, scope: str) -> str | None:
        """The full name of a message or enum as protobuf resolves it from ``scope``."""
        if type_name.startswith("."):
            return self.known.get(type_name[1:])
        parts = scope.split(".")
        while parts:
            candidate = ".".join([*parts, type_name])
            if candidate in self.known:
                return candidate
            parts.pop()
        return self.known.get(type_name)

    def type_ref(self, type_name: str, scope: str) -> str:
        if type_name in SCALARS:
            return f"`{type_name}`"
        full = self.resolve(type_name, scope)
        if full is None:
            return f"`{type_name}`"
        return f"[`{self.local_name(full)}`](#{_anchor(full)})"

    def field_type(self, field: Field, scope: str) -> str:
        if field.label == "map":
            if field.type in SCALARS:
                return f"`map<{field.key_type}, {field.type}>`"
            return f"`map<{field.key_type}, `{self.type_ref(field.type, scope)}`>`"
        ref = self.type_ref(field.type, scope)
        return f"{field.label} {ref}" if field.label else ref

    def render(self) -> str:
        lines = [
            "# API reference",
            "",
            "Generated by `scripts/render_api_docs.py` from the comments of",
            "`proto/substrate/v1/*.proto`; do not edit by hand: regenerate it with",
            "`python scripts/render_api_docs.py > docs/api.md` (a test fails if it is stale).",
            "",
            "Every service speaks gRPC. `Control` is the public API (clients, the SDK and the",
            "router call it on ateapi); `WorkerRegistry` is how each node's atelet registers its",
            "workers with ateapi; `Atelet` is how ateapi drives a node; `Ateworker` is how atelet",
            "drives one worker over the worker's Unix socket. All but `Ateworker` run over mutual",
            "TLS with SPIFFE identities; `docs/architecture.md` shows who calls whom.",
            "",
            "## Contents",
            "",
        ]
        for f in self.files:
            summary = ", ".join(f"service `{s.name}`" for s in f.services) or "records"
            lines.append(f"- [{f.path}](#{_anchor(f.path)}) — {summary}")
        lines.append("")
        for f in self.files:
            lines += self.render_file(f)
        while lines and lines[-1] == "":
            lines.pop()
        return "\n".join(lines) + "\n"

    def render_file(self, f: ProtoFile) -> Iterator[str]:
        yield f'<a id="{_anchor(f.path)}"></a>'
        yield ""
        yield f"## {f.path}"
        yield ""
        yield f"Package `{f.package}`."
        if f.imports:
            yield "Imports " + ", ".join(f"`{i}`" for i in f.imports) + "."
        yield ""
        yield from _paragraphs(f.comment)
        for service in f.services:
            yield from self.render_service(service, f.package)
        if f.enums:
            yield "### Enums"
            yield ""
            for enum in f.enums:
                yield from self.render_enum(enum)
        if f.messages:
            yield "### Messages"
            yield ""
            for message in f.messages:
                yield from self.render_message(message)

    def render_service(self, s: Service, scope: str) -> Iterator[str]:
        yield f'<a id="{_anchor(s.full_name)}"></a>'
        yield ""
        yield f"### service `{s.name}`"
        yield ""
        yield f"`{s.full_name}`"
        yield ""
        yield from _paragraphs(s.comment)
        yield "| RPC | request | response | description |"
        yield "|---|---|---|---|"
        for rpc in s.rpcs:
            request = self.type_ref(rpc.request, scope)
            response = self.type_ref(rpc.response, scope)
            if rpc.client_streaming:
                request = f"stream {request}"
            if rpc.server_streaming:
                response = f"stream {response}"
            yield f"| `{rpc.name}` | {request} | {response} | {_cell(rpc.comment)} |"
        yield ""

    def render_enum(self, e: Enum) -> Iterator[str]:
        yield f'<a id="{_anchor(e.full_name)}"></a>'
        yield ""
        yield f"#### enum `{self.local_name(e.full_name)}`"
        yield ""
        yield from _paragraphs(e.comment)
        yield "| value | number | description |"
        yield "|---|---|---|"
        for v in e.values:
            yield f"| `{v.name}` | {v.number} | {_cell(v.comment)} |"
        yield ""

    def render_message(self, m: Message) -> Iterator[str]:
        yield f'<a id="{_anchor(m.full_name)}"></a>'
        yield ""
        yield f"#### `{self.local_name(m.full_name)}`"
        yield ""
        yield from _paragraphs(m.comment)
        if not m.fields:
            yield "No fields."
            yield ""
        else:
            yield "| field | number | type | description |"
            yield "|---|---|---|---|"
            for field in m.fields:
                description = _cell(field.comment)
                if field.oneof:
                    description = f"(oneof `{field.oneof}`) {description}"
                yield (
                    f"| `{field.name}` | {field.number} | {self.field_type(field, m.full_name)} "
                    f"| {description} |"
                )
            yield ""
        if m.reserved:
            yield "Reserved: " + "; ".join(f"`{r}`" for r in m.reserved) + "."
            yield ""


def render(proto_dir: Path = PROTO_DIR) -> str:
    return Renderer(proto_files(proto_dir)).render()


if __name__ == "__main__":
    try:
        print(render(), end="")
    except ProtoSyntaxError as exc:
        print(f"render_api_docs: {exc}", file=sys.stderr)
        sys.exit(1)
