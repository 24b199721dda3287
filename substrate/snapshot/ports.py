"""The object-storage port: ``BlobStore``, the async protocol snapshot transfer runs over.

A blob store holds opaque objects under string keys. Keys are relative to the store's root
(the bucket and prefix, or the directory, it was opened on), use ``/`` as separator and
obey :func:`validate_key`; every method raises :class:`InvalidArgument` for a key that does
not. The shell implements the protocol (obstore for ``file://``, ``memory://``, ``s3://``
and ``gs://``; a pure in-memory store for tests and the simulator); this module only
declares it, so it stays free of I/O.

Errors every method may raise, besides those listed on the method:

* :class:`InvalidArgument`: a malformed key or prefix (nothing was sent to the store);
* :class:`Unavailable`: the store could not be reached or failed (connection refused,
  DNS, timeouts after the adapter's retries, 5xx answers, a missing bucket);
* :class:`PermissionDenied` / :class:`Unauthenticated`: the store refused the credentials.

Nothing else escapes from the store itself; errors of the *local* filesystem (the path
given to :meth:`BlobStore.put_file` or :meth:`BlobStore.get_to_file`) are :class:`OSError`.
Cancellation (an enclosing cancel scope or ``fail_after``) is honoured by every method.

One limitation is shared by file-backed stores and therefore left unspecified: a key that
is also the "directory" of other keys (``a`` next to ``a/b``) may fail on some stores.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from substrate.errors import InvalidArgument

KEY_MAX: Final = 1024
"""Longest key accepted, in characters (S3's limit, in bytes, for ASCII keys)."""

_SEGMENT_RE: Final = re.compile(r"^[A-Za-z0-9._+=@,~-]+$")


def validate_key(key: str, *, what: str = "object key") -> str:
    """Return ``key`` if it is a portable object key, else raise :class:`InvalidArgument`.

    A key is one or more ``/``-separated segments, each made of ASCII letters, digits and
    ``. _ + = @ , ~ -``; no segment may be empty, ``.`` or ``..`` (so no leading, trailing
    or doubled ``/``), and the key is at most :data:`KEY_MAX` characters. These keys mean
    the same thing on S3, GCS, a local directory and in memory.
    """
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{what} is required")
    if len(key) > KEY_MAX:
        raise InvalidArgument(f"{what} is longer than {KEY_MAX} characters")
    for segment in key.split("/"):
        if not segment:
            raise InvalidArgument(f"{what} {key!r} must not have empty segments or '/' ends")
        if segment in {".", ".."}:
            raise InvalidArgument(f"{what} {key!r} must not have '.' or '..' segments")
        if not _SEGMENT_RE.match(segment):
            raise InvalidArgument(
                f"{what} {key!r} may only contain ASCII letters, digits, '/' and '._+=@,~-'"
            )
    return key


def normalize_prefix(prefix: str) -> str:
    """The listing prefix ``prefix`` stands for: ``""`` (everything) or ``<key>/``.

    A missing trailing ``/`` is added, so prefixes match whole segments: ``a/b`` lists
    ``a/b/x`` but never ``a/bc``. Raises :class:`InvalidArgument` if the part before the
    ``/`` is not a valid key.
    """
    if not isinstance(prefix, str):
        raise InvalidArgument("object key prefix must be a string")
    if prefix == "":
        return ""
    body = prefix[:-1] if prefix.endswith("/") else prefix
    validate_key(body, what="object key prefix")
    return body + "/"


@runtime_checkable
class BlobStore(Protocol):
    """Async object storage with whole-object semantics (see the module docstring)."""

    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object there.

        Atomic: a reader sees the previous object (or none) until the new one is complete,
        and never a partial object. On failure the previous object, if any, is unchanged.
        """
        ...

    async def put_file(self, key: str, path: Path) -> None:
        """Store the content of the local file ``path`` under ``key`` (streamed).

        Same atomicity as :meth:`put`. The file is read in chunks (multipart uploads on
        stores that have them), so a large file is never held in memory whole. Raises
        :class:`InvalidArgument` if ``path`` is not an existing regular file.
        """
        ...

    async def get(self, key: str) -> bytes:
        """The whole object under ``key``; :class:`NotFound` if there is none."""
        ...

    async def get_to_file(self, key: str, path: Path) -> None:
        """Write the object under ``key`` to the local file ``path`` (streamed).

        The object is streamed to a temporary file beside ``path`` which is then renamed
        over it, so ``path`` is either untouched or the complete object. The parent
        directory must exist. Raises :class:`NotFound` if there is no object (``path`` is
        then left as it was).
        """
        ...

    async def head(self, key: str) -> int:
        """The size in bytes of the object under ``key``; :class:`NotFound` if none."""
        ...

    async def list(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix``, recursively, sorted; ``[]`` if there are none.

        ``prefix`` is normalized by :func:`normalize_prefix`: ``""`` lists the whole store,
        anything else matches whole segments (``a/b`` lists ``a/b/x``, not ``a/bc``).
        """
        ...

    async def delete(self, key: str) -> None:
        """Remove the object under ``key``. Idempotent: a missing object is not an error."""
        ...

    async def copy(self, src: str, dst: str) -> None:
        """Copy the object ``src`` to ``dst`` (within this store), replacing ``dst``.

        Raises :class:`NotFound` if ``src`` does not exist. Later writes to either key do
        not affect the other.
        """
        ...


__all__ = ["KEY_MAX", "BlobStore", "normalize_prefix", "validate_key"]
