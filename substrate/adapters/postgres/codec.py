"""Model records to JSON documents and back, driven by the records' own type annotations."""

from __future__ import annotations

import enum
import json
import math
import types
import typing
from typing import Any, TypeVar, cast

import attrs

from substrate.core.ids import Labels
from substrate.errors import Internal, InvalidArgument

T = TypeVar("T")

JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]


class Codec:
    """Converts model records to JSON-compatible values and back (type hints cached).

    Encoding: attrs records become objects keyed by field name; enums their member name;
    tuples lists; frozensets sorted lists; :class:`Labels` a list of ``[key, value]``
    pairs; ``None`` null. Decoding follows the annotations, so a missing key takes the
    field's default (documents written before a field was added still load) and unknown
    keys are ignored. A malformed document raises :class:`Internal`.
    """

    def __init__(self) -> None:
        self._hints: dict[type, dict[str, Any]] = {}

    # --- encode -----------------------------------------------------------------------

    def to_json(self, value: object) -> JSON:
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, enum.Enum):
            return value.name
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidArgument(f"cannot store the non-finite number {value}")
            return value
        if isinstance(value, Labels):
            return [[k, v] for k, v in value.items]
        if isinstance(value, frozenset):
            return sorted((self.to_json(v) for v in value), key=json.dumps)
        if isinstance(value, tuple | list):
            return [self.to_json(v) for v in value]
        if attrs.has(type(value)):
            cls = cast("type[attrs.AttrsInstance]", type(value))
            return {f.name: self.to_json(getattr(value, f.name)) for f in attrs.fields(cls)}
        raise Internal(f"the store cannot encode a {type(value).__name__}")

    def dumps(self, value: object) -> str:
        """``value`` as JSON text (for a ``jsonb`` parameter)."""
        return json.dumps(self.to_json(value), separators=(",", ":"), allow_nan=False)

    # --- decode -----------------------------------------------------------------------

    def from_json(self, cls: type[T], data: JSON) -> T:
        try:
            return cast(T, self._decode(cls, data))
        except (KeyError, TypeError, ValueError, OverflowError, InvalidArgument) as exc:
            raise Internal(f"stored {cls.__name__} document is malformed: {exc}") from exc

    def loads(self, cls: type[T], text: str) -> T:
        """Decode ``text`` (a ``jsonb`` column) as a ``cls``."""
        return self.from_json(cls, json.loads(text))

    def _hints_of(self, cls: type) -> dict[str, Any]:
        hints = self._hints.get(cls)
        if hints is None:
            hints = typing.get_type_hints(cls)
            self._hints[cls] = hints
        return hints

    def _decode(self, tp: Any, data: JSON) -> Any:
        origin = typing.get_origin(tp)
        if origin is types.UnionType or origin is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if data is None:
                return None
            if len(args) != 1:
                raise TypeError(f"cannot decode the union {tp}")
            return self._decode(args[0], data)
        if origin is tuple:
            item = typing.get_args(tp)[0]
            return tuple(self._decode(item, v) for v in _as_list(data))
        if origin is frozenset:
            item = typing.get_args(tp)[0]
            return frozenset(self._decode(item, v) for v in _as_list(data))
        if tp is Labels:
            return Labels(tuple((str(k), str(v)) for k, v in _as_pairs(data)))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            if not isinstance(data, str):
                raise TypeError(f"{tp.__name__} must be a member name, got {data!r}")
            return tp[data]
        if tp is bool:
            if not isinstance(data, bool):
                raise TypeError(f"expected a boolean, got {data!r}")
            return data
        if tp is int:
            if isinstance(data, bool) or not isinstance(data, int | float) or data != int(data):
                raise TypeError(f"expected an integer, got {data!r}")
            return int(data)
        if tp is float:
            if isinstance(data, bool) or not isinstance(data, int | float):
                raise TypeError(f"expected a number, got {data!r}")
            return float(data)
        if tp is str:
            if not isinstance(data, str):
                raise TypeError(f"expected a string, got {data!r}")
            return data
        if isinstance(tp, type) and attrs.has(tp):
            if not isinstance(data, dict):
                raise TypeError(f"{tp.__name__} must be an object, got {data!r}")
            hints = self._hints_of(tp)
            kwargs = {
                f.alias: self._decode(hints[f.name], data[f.name])
                for f in attrs.fields(tp)
                if f.init and f.name in data
            }
            return tp(**kwargs)
        raise TypeError(f"cannot decode type {tp!r}")


def _as_list(data: JSON) -> list[JSON]:
    if not isinstance(data, list):
        raise TypeError(f"expected a list, got {data!r}")
    return data


def _as_pairs(data: JSON) -> list[tuple[JSON, JSON]]:
    pairs: list[tuple[JSON, JSON]] = []
    for item in _as_list(data):
        if not isinstance(item, list) or len(item) != 2:
            raise TypeError(f"expected a [key, value] pair, got {item!r}")
        pairs.append((item[0], item[1]))
    return pairs
