"""Typed references and name validation (never bare strings for identities)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Final

import attrs

from substrate.errors import InvalidArgument

DNS1123_LABEL_MAX: Final = 63
DNS1123_SUBDOMAIN_MAX: Final = 253
LABEL_VALUE_MAX: Final = 63
SELECTOR_MAX_LABELS: Final = 10
LABELS_MAX: Final = 64
GOLDEN_ATESPACE: Final = "ate-golden"

_LABEL_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_RE: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUALIFIED_NAME_RE: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def validate_dns_label(value: str, *, what: str) -> str:
    """Return ``value`` if it is a DNS-1123 label, else raise :class:`InvalidArgument`."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} is required")
    if len(value) > DNS1123_LABEL_MAX:
        raise InvalidArgument(
            f"{what} {value!r} is invalid: must be no more than {DNS1123_LABEL_MAX} characters"
        )
    if not _LABEL_RE.match(value):
        raise InvalidArgument(
            f"{what} {value!r} is invalid: a DNS-1123 label must consist of lower case "
            "alphanumeric characters or '-', and must start and end with an alphanumeric "
            "character (regex '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        )
    return value


def validate_dns_subdomain(value: str, *, what: str) -> str:
    """Return ``value`` if it is a DNS-1123 subdomain, else raise :class:`InvalidArgument`."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} is required")
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        raise InvalidArgument(
            f"{what} {value!r} is invalid: must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        )
    if not _SUBDOMAIN_RE.match(value):
        raise InvalidArgument(
            f"{what} {value!r} is invalid: a DNS-1123 subdomain must consist of lower case "
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
            "character"
        )
    return value


def validate_label_key(key: str) -> str:
    """Validate a Kubernetes-style label key (``[prefix/]name``)."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument("label key is required")
    prefix, sep, name = key.rpartition("/")
    if sep:
        if not prefix:
            raise InvalidArgument(f"label key {key!r} is invalid: prefix part must be non-empty")
        validate_dns_subdomain(prefix, what=f"label key {key!r} prefix")
    if len(name) > DNS1123_LABEL_MAX:
        raise InvalidArgument(
            f"label key {key!r} is invalid: name part must be no more than "
            f"{DNS1123_LABEL_MAX} characters"
        )
    if not _QUALIFIED_NAME_RE.match(name):
        raise InvalidArgument(
            f"label key {key!r} is invalid: name part must consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return key


def validate_label_value(key: str, value: str) -> str:
    """Validate a label value (empty is allowed)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"label {key!r} value must be a string")
    if len(value) > LABEL_VALUE_MAX:
        raise InvalidArgument(
            f"label {key!r} value {value!r} is invalid: must be no more than "
            f"{LABEL_VALUE_MAX} characters"
        )
    if value and not _QUALIFIED_NAME_RE.match(value):
        raise InvalidArgument(
            f"label {key!r} value {value!r} is invalid: must consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return value


def _labels_converter(
    value: Mapping[str, str] | Labels | tuple[tuple[str, str], ...],
) -> tuple[tuple[str, str], ...]:
    if isinstance(value, Labels):
        return value.items
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = list(value)
    return tuple(sorted((str(k), str(v)) for k, v in pairs))


@attrs.frozen(slots=True)
class Labels:
    """An immutable, sorted set of ``key=value`` labels (also used as an equality selector)."""

    items: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_labels_converter)

    @classmethod
    def of(cls, mapping: Mapping[str, str] | None = None, /, **kwargs: str) -> Labels:
        merged = dict(mapping or {})
        merged.update(kwargs)
        return cls(merged)

    def validate(self, *, what: str = "labels", limit: int = LABELS_MAX) -> Labels:
        keys = [k for k, _ in self.items]
        if len(set(keys)) != len(keys):
            raise InvalidArgument(f"{what} has duplicate keys")
        if len(self.items) > limit:
            raise InvalidArgument(
                f"{what} has {len(self.items)} labels, more than the limit of {limit}"
            )
        for k, v in self.items:
            validate_label_key(k)
            validate_label_value(k, v)
        return self

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)

    def get(self, key: str) -> str | None:
        for k, v in self.items:
            if k == key:
                return v
        return None

    def matches(self, labels: Labels) -> bool:
        """True if every label of this selector is present with the same value in ``labels``."""
        if not self.items:
            return True
        have = dict(labels.items)
        return all(have.get(k) == v for k, v in self.items)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


def validate_selector(selector: Labels, *, what: str = "worker selector") -> Labels:
    """A worker selector: at most ten labels with valid keys and values."""
    return selector.validate(what=what, limit=SELECTOR_MAX_LABELS)


@attrs.frozen(slots=True, order=True)
class ActorRef:
    """An actor's identity: unique by (atespace, name) — never by name alone."""

    atespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.atespace}/{self.name}"

    def validate(self) -> ActorRef:
        validate_dns_label(self.atespace, what="atespace")
        validate_dns_label(self.name, what="actor name")
        return self

    @classmethod
    def parse(cls, text: str) -> ActorRef:
        """Parse ``atespace/name`` (the ``ate-target-actor`` header form), validated."""
        if not isinstance(text, str) or text.count("/") != 1:
            raise InvalidArgument(f"actor reference {text!r} must have the form <atespace>/<name>")
        atespace, name = text.split("/")
        return cls(atespace=atespace, name=name).validate()

    @property
    def lease_key(self) -> str:
        return f"lease:actor:{self.atespace}:{self.name}"


@attrs.frozen(slots=True, order=True)
class TemplateRef:
    """An actor template, scoped to an atespace."""

    atespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.atespace}/{self.name}"

    def validate(self) -> TemplateRef:
        validate_dns_label(self.atespace, what="template atespace")
        validate_dns_label(self.name, what="template name")
        return self


@attrs.frozen(slots=True, order=True)
class TagRef:
    """A snapshot tag, scoped to an atespace."""

    atespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.atespace}/{self.name}"

    def validate(self) -> TagRef:
        validate_dns_label(self.atespace, what="tag atespace")
        validate_dns_label(self.name, what="tag name")
        return self


@attrs.frozen(slots=True, order=True)
class WorkerRef:
    """A worker (one pre-warmed worker process); the name is opaque and fleet-unique."""

    name: str

    def __str__(self) -> str:
        return self.name

    def validate(self) -> WorkerRef:
        validate_dns_subdomain(self.name, what="worker name")
        return self


@attrs.frozen(slots=True, order=True)
class NodeRef:
    """A node: one machine (or one node directory) with one atelet."""

    name: str

    def __str__(self) -> str:
        return self.name

    def validate(self) -> NodeRef:
        validate_dns_subdomain(self.name, what="node name")
        return self


__all__ = [
    "GOLDEN_ATESPACE",
    "SELECTOR_MAX_LABELS",
    "ActorRef",
    "Labels",
    "NodeRef",
    "TagRef",
    "TemplateRef",
    "WorkerRef",
    "validate_dns_label",
    "validate_dns_subdomain",
    "validate_label_key",
    "validate_label_value",
    "validate_selector",
]
