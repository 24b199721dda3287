"""Model records to JSON documents and back, driven by the records' own type annotations.

Every type is looked at once: the first time a record class (or annotation) is encoded or
decoded, the codec builds a small function for it from its fields and type hints and keeps
it, so later calls do no ``typing`` introspection and no per-value type dispatch beyond a
dictionary lookup. The documents are the same as before this was compiled (the stored
format did not change).
"""

from __future__ import annotations

import enum
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import attrs

from substrate.core.ids import Labels
from substrate.errors import Internal, InvalidArgument

T = TypeVar("T")

JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]

Encoder = Callable[[Any], JSON]
Decoder = Callable[[JSON], Any]

_MISSING: Final = object()
_NONE_TYPE: Final = type(None)

_TEXT: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""``json.dumps(..., separators=(",", ":"), allow_nan=False)`` without re-creating it per call."""

_DECODE_ERRORS: Final = (KeyError, TypeError, ValueError, OverflowError, InvalidArgument)


def _identity(value: Any) -> JSON:
    return cast(JSON, value)


def _enum_name(value: enum.Enum) -> JSON:
    return value.name


def _finite(value: float) -> JSON:
    if not math.isfinite(value):
        raise InvalidArgument(f"cannot store the non-finite number {value}")
    return value


def _labels(value: Labels) -> JSON:
    return [[k, v] for k, v in value.items]


class Codec:
    """Converts model records to JSON-compatible values and back (per-type code cached).

    Encoding: attrs records become objects keyed by field name; enums their member name;
    tuples lists; frozensets sorted lists; :class:`Labels` a list of ``[key, value]``
    pairs; ``None`` null. Decoding follows the annotations, so a missing key takes the
    field's default (documents written before a field was added still load) and unknown
    keys are ignored. A malformed document raises :class:`Internal`.
    """

    def __init__(self) -> None:
        self._encoders: dict[type, Encoder] = {}
        self._decoders: dict[Any, Decoder] = {}
        self._building: set[Any] = set()  # decoders being built (for recursive types)
        self._encoding: set[type] = set()  # encoders being built (likewise)

    # --- encode -----------------------------------------------------------------------

    def to_json(self, value: object) -> JSON:
        encode = self._encoders.get(type(value))
        if encode is None:
            encode = self._encoder_for(type(value))
        return encode(value)

    def dumps(self, value: object) -> str:
        """``value`` as JSON text (for a ``jsonb`` parameter)."""
        return _TEXT.encode(self.to_json(value))

    def _encoder_for(self, cls: type) -> Encoder:
        """The encoder of values of exactly ``cls`` (same rules, in the same order, as
        the value-by-value dispatch this replaced)."""
        encode: Encoder
        if cls is _NONE_TYPE or issubclass(cls, bool | str):
            encode = _identity
        elif issubclass(cls, enum.Enum):
            encode = _enum_name
        elif issubclass(cls, int):
            encode = _identity
        elif issubclass(cls, float):
            encode = _finite
        elif issubclass(cls, Labels):
            encode = _labels
        elif issubclass(cls, frozenset):
            encode = self._frozenset_encoder()
        elif issubclass(cls, tuple | list):
            encode = self._sequence_encoder()
        elif attrs.has(cls):
            encode = self._record_encoder(cls)
        else:
            name = cls.__name__

            def encode(_value: Any) -> JSON:
                raise Internal(f"the store cannot encode a {name}")

            return encode  # not cached: an error path
        self._encoders[cls] = encode
        return encode

    def _frozenset_encoder(self) -> Encoder:
        to_json = self.to_json

        def encode(value: frozenset[Any]) -> JSON:
            return sorted((to_json(v) for v in value), key=json.dumps)

        return encode

    def _sequence_encoder(self) -> Encoder:
        to_json = self.to_json

        def encode(value: tuple[Any, ...] | list[Any]) -> JSON:
            return [to_json(v) for v in value]

        return encode

    def _record_encoder(self, cls: type) -> Encoder:
        """Generated code: one line per field, with an exact-type fast path for the
        field's annotated type and :meth:`to_json` for anything else."""
        hints = typing.get_type_hints(cls)
        names = [f.name for f in attrs.fields(cast("type[attrs.AttrsInstance]", cls))]
        scope: dict[str, Any] = {"to_json": self.to_json, "Labels": Labels}
        lines = ["def encode(r):", "    d = {}"]
        self._encoding.add(cls)
        try:
            for name in names:
                lines.append(f"    v = r.{name}")
                lines.append(f"    d[{name!r}] = {self._encode_expr(hints.get(name), 'v', scope)}")
        finally:
            self._encoding.discard(cls)
        lines.append("    return d")
        return cast(Encoder, _compile(lines, scope, "encode", cls))

    def _encode_expr(self, tp: Any, var: str, scope: dict[str, Any]) -> str:
        """A Python expression encoding the value ``var`` of a field annotated ``tp``.

        Each fast path is guarded by an exact type check and gives what :meth:`to_json`
        gives for that type; every other value goes through :meth:`to_json`.
        """
        fallback = f"to_json({var})"
        if tp is str or tp is int or tp is bool:
            return f"({var} if type({var}) is {tp.__name__} else {fallback})"
        if tp is float:  # finite floats only: x - x is nan for inf and nan
            return f"({var} if type({var}) is float and {var} - {var} == 0.0 else {fallback})"
        origin = typing.get_origin(tp)
        if origin is types.UnionType or origin is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not _NONE_TYPE]
            if len(args) == 1:
                return f"(None if {var} is None else {self._encode_expr(args[0], var, scope)})"
        elif origin is tuple:
            item = self._encode_expr(typing.get_args(tp)[0], "i", scope)
            return f"([{item} for i in {var}] if type({var}) is tuple else {fallback})"
        elif isinstance(tp, type) and issubclass(tp, enum.Enum):
            names = _bind(scope, {member: member.name for member in tp})
            return f"({names}[{var}] if type({var}) is {_bind(scope, tp)} else {fallback})"
        elif tp is Labels:
            return f"([[k, w] for k, w in {var}.items] if type({var}) is Labels else {fallback})"
        elif isinstance(tp, type) and tp not in self._encoding and attrs.has(tp):
            encode = _bind(scope, self._encoders.get(tp) or self._encoder_for(tp))
            return f"({encode}({var}) if type({var}) is {_bind(scope, tp)} else {fallback})"
        return fallback

    # --- decode -----------------------------------------------------------------------

    def from_json(self, cls: type[T], data: JSON) -> T:
        try:
            return cast(T, self.decoder(cls)(data))
        except _DECODE_ERRORS as exc:
            raise Internal(f"stored {cls.__name__} document is malformed: {exc}") from exc

    def loads(self, cls: type[T], text: str) -> T:
        """Decode ``text`` (a ``jsonb`` column) as a ``cls``."""
        return self.from_json(cls, json.loads(text))

    def decoder(self, tp: Any) -> Decoder:
        """The decoder of annotation ``tp``: built on first use, then reused."""
        try:
            decode = self._decoders.get(tp)
        except TypeError:  # an unhashable annotation: build it every time
            return self._build_decoder(tp)
        if decode is None:
            decode = self._build_decoder(tp)
            self._decoders[tp] = decode
        return decode

    def _build_decoder(self, tp: Any) -> Decoder:
        origin = typing.get_origin(tp)
        if origin is types.UnionType or origin is typing.Union:
            return self._union_decoder(tp)
        if origin is tuple or origin is frozenset:
            return self._collection_decoder(origin, typing.get_args(tp)[0])
        if tp is Labels:
            return _decode_labels
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return _enum_decoder(tp)
        if tp is bool:
            return _decode_bool
        if tp is int:
            return _decode_int
        if tp is float:
            return _decode_float
        if tp is str:
            return _decode_str
        if isinstance(tp, type) and attrs.has(tp):
            return self._record_decoder(tp)

        def unknown(_data: JSON) -> Any:
            raise TypeError(f"cannot decode type {tp!r}")

        return unknown

    def _union_decoder(self, tp: Any) -> Decoder:
        args = [a for a in typing.get_args(tp) if a is not _NONE_TYPE]
        if len(args) != 1:

            def ambiguous(data: JSON) -> Any:
                if data is None:
                    return None
                raise TypeError(f"cannot decode the union {tp}")

            return ambiguous
        inner = self._lazy(args[0])

        def optional(data: JSON) -> Any:
            return None if data is None else inner(data)

        return optional

    def _collection_decoder(self, origin: Any, item: Any) -> Decoder:
        inner = self._lazy(item)
        make: Callable[[list[Any]], Any] = tuple if origin is tuple else frozenset

        def collection(data: JSON) -> Any:
            if not isinstance(data, list):
                raise TypeError(f"expected a list, got {data!r}")
            return make([inner(v) for v in data])

        return collection

    def _record_decoder(self, cls: type) -> Decoder:
        """Generated code: one block per field; a missing key keeps the default."""
        hints = typing.get_type_hints(cls)
        fields = attrs.fields(cast("type[attrs.AttrsInstance]", cls))
        scope: dict[str, Any] = {
            "_MISSING": _MISSING,
            "_cls": cls,
            "_str": _decode_str,
            "_int": _decode_int,
            "_float": _decode_float,
            "_bool": _decode_bool,
        }
        lines = [
            "def record(data):",
            "    if not isinstance(data, dict):",
            f"        raise TypeError({cls.__name__ + ' must be an object, got '!r} + repr(data))",
            "    get = data.get",
            "    kw = {}",
        ]
        for f in fields:
            if not f.init:
                continue
            lines.append(f"    v = get({f.name!r}, _MISSING)")
            lines.append("    if v is not _MISSING:")
            lines.append(f"        kw[{f.alias!r}] = {self._decode_expr(hints[f.name], scope)}")
        lines.append("    return _cls(**kw)")
        return cast(Decoder, _compile(lines, scope, "record", cls))

    def _decode_expr(self, tp: Any, scope: dict[str, Any]) -> str:
        """A Python expression decoding the JSON value ``v`` as a ``tp``."""
        simple = {str: "_str", int: "_int", float: "_float", bool: "_bool"}.get(tp)
        if simple is not None:
            return f"(v if type(v) is {tp.__name__} else {simple}(v))"
        origin = typing.get_origin(tp)
        if origin is types.UnionType or origin is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not _NONE_TYPE]
            if len(args) == 1:
                return f"(None if v is None else {self._decode_expr(args[0], scope)})"
        elif isinstance(tp, type) and issubclass(tp, enum.Enum):
            members = _bind(scope, tp.__members__)
            slow = _bind(scope, self._lazy(tp))
            return f"({members}[v] if type(v) is str else {slow}(v))"
        return f"{_bind(scope, self._lazy(tp))}(v)"

    def _lazy(self, tp: Any) -> Decoder:
        """The decoder of ``tp``, or (while ``tp`` is itself being built, for a recursive
        type) a stand-in that looks it up on first call."""
        try:
            known = self._decoders.get(tp)
        except TypeError:
            known = None
        if known is not None:
            return known
        if isinstance(tp, type) and attrs.has(tp):
            decoders = self._decoders
            decoder = self.decoder
            if tp in self._building:
                return lambda data: decoders[tp](data)
            self._building.add(tp)
            try:
                return decoder(tp)
            finally:
                self._building.discard(tp)
        return self.decoder(tp)


def _bind(scope: dict[str, Any], value: object) -> str:
    """A fresh name for ``value`` in the generated code's globals."""
    name = f"_g{len(scope)}"
    scope[name] = value
    return name


def _compile(lines: list[str], scope: dict[str, Any], name: str, cls: type) -> object:
    source = "\n".join(lines) + "\n"
    origin = f"<substrate codec {name} {cls.__module__}.{cls.__qualname__}>"
    # Our own generated code: only attrs field names and reprs of them go into it.
    exec(compile(source, origin, "exec"), scope)
    return scope[name]


def _decode_labels(data: JSON) -> Labels:
    return Labels(tuple((str(k), str(v)) for k, v in _as_pairs(data)))


def _enum_decoder(cls: type[enum.Enum]) -> Decoder:
    members = cls.__members__
    name = cls.__name__

    def member(data: JSON) -> enum.Enum:
        if not isinstance(data, str):
            raise TypeError(f"{name} must be a member name, got {data!r}")
        return members[data]

    return member


def _decode_bool(data: JSON) -> bool:
    if not isinstance(data, bool):
        raise TypeError(f"expected a boolean, got {data!r}")
    return data


def _decode_int(data: JSON) -> int:
    if type(data) is int:
        return data
    if isinstance(data, bool) or not isinstance(data, int | float) or data != int(data):
        raise TypeError(f"expected an integer, got {data!r}")
    return int(data)


def _decode_float(data: JSON) -> float:
    if type(data) is float:
        return data
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise TypeError(f"expected a number, got {data!r}")
    return float(data)


def _decode_str(data: JSON) -> str:
    if not isinstance(data, str):
        raise TypeError(f"expected a string, got {data!r}")
    return data


def _as_pairs(data: JSON) -> list[tuple[JSON, JSON]]:
    if not isinstance(data, list):
        raise TypeError(f"expected a list, got {data!r}")
    pairs: list[tuple[JSON, JSON]] = []
    for item in data:
        if not isinstance(item, list) or len(item) != 2:
            raise TypeError(f"expected a [key, value] pair, got {item!r}")
        pairs.append((item[0], item[1]))
    return pairs
