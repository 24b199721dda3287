"""Open a :class:`~substrate.snapshot.ports.BlobStore` by URL, and map snapshot URIs to stores.

Supported URLs (see :func:`open_blobstore`):

* ``file:///abs/dir`` — a local directory (the embedded default), created if missing;
* ``memory://`` (or ``memory:///prefix``) — obstore's in-process memory store;
* ``s3://bucket[/prefix]`` — S3 or an S3-compatible server (endpoint, region, path-style
  addressing and credentials from :class:`ObjectStoreOptions`);
* ``gs://bucket[/prefix]`` — Google Cloud Storage.

This module is the only place that reads the environment for object storage, and only
when a caller passes ``from_env=True`` (:func:`options_from_env`). Note that obstore's
own S3 and GCS builders still consult their standard variables (``AWS_*``,
``GOOGLE_*``) for any setting that the options leave unset; pass explicit options to
pin a setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit

import attrs
from obstore.store import GCSStore, LocalStore, MemoryStore, S3Store

from substrate.adapters.objectstore.blobstore import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_PART_CONCURRENCY,
    ObstoreBlobStore,
    translate_error,
)
from substrate.errors import InvalidArgument, SubstrateError
from substrate.snapshot.ports import normalize_prefix

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

DEFAULT_CONNECT_TIMEOUT: Final = 5.0
"""Seconds to establish a connection (each attempt)."""
DEFAULT_TIMEOUT: Final = 900.0
"""Seconds for one whole request, body included; large enough for multi-GiB downloads."""
DEFAULT_READ_TIMEOUT: Final = 60.0
"""Seconds a transfer may stall between two reads before it counts as failed."""
DEFAULT_MAX_RETRIES: Final = 3
"""Retries of a failed request (connection errors, 5xx, timeouts of safe requests)."""
DEFAULT_RETRY_TIMEOUT: Final = 30.0
"""Seconds after the first attempt when no further retry starts."""

SCHEMES: Final = ("file", "memory", "s3", "gs")


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidArgument(f"object store option {attribute.name} must be positive")


def _non_negative_int(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"object store option {attribute.name} must be an integer >= 0")


@attrs.frozen(slots=True, kw_only=True)
class ObjectStoreOptions:
    """Settings for remote stores; ``None`` means "not set" (a default or obstore's own).

    ``endpoint`` is the S3 endpoint URL (e.g. ``http://127.0.0.1:9000`` for MinIO) or the
    GCS base URL. ``path_style`` selects path-style S3 addressing (``endpoint/bucket/key``)
    instead of virtual-hosted style; obstore's default is path style. ``allow_http``
    defaults to true exactly when the endpoint is ``http://``. Timeouts are seconds.
    Secrets are left out of ``repr``.
    """

    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = attrs.field(default=None, repr=False)
    session_token: str | None = attrs.field(default=None, repr=False)
    skip_signature: bool | None = None
    """Send unsigned requests (public buckets, or test servers without auth)."""
    allow_http: bool | None = None
    service_account_path: str | None = None
    """GCS: path of a service-account JSON file."""
    service_account_key: str | None = attrs.field(default=None, repr=False)
    """GCS: the service-account JSON itself."""
    application_credentials: str | None = None
    """GCS: path of an application-default-credentials file."""
    connect_timeout: float | None = attrs.field(default=None, validator=_positive)
    timeout: float | None = attrs.field(default=None, validator=_positive)
    read_timeout: float | None = attrs.field(default=None, validator=_positive)
    max_retries: int | None = attrs.field(default=None, validator=_non_negative_int)
    retry_timeout: float | None = attrs.field(default=None, validator=_positive)
    chunk_size: int | None = attrs.field(default=None, validator=_positive)
    """Multipart part size in bytes (at least 5 MiB)."""
    part_concurrency: int | None = attrs.field(default=None, validator=_positive)

    def over(self, base: ObjectStoreOptions) -> ObjectStoreOptions:
        """These options with every unset field taken from ``base``."""
        changes = {
            f.name: getattr(base, f.name)
            for f in attrs.fields(ObjectStoreOptions)
            if getattr(self, f.name) is None
        }
        return attrs.evolve(self, **changes)


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})


def _env_bool(environ: Mapping[str, str], name: str) -> bool | None:
    raw = environ.get(name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidArgument(f"environment variable {name}={raw!r} is not a boolean")


def _env_first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


def options_from_env(environ: Mapping[str, str] | None = None) -> ObjectStoreOptions:
    """Object-store options from the standard variables (``environ`` or ``os.environ``).

    S3: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT``, ``AWS_REGION`` /
    ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, ``AWS_S3_FORCE_PATH_STYLE`` (or the inverse
    ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST``), ``AWS_ALLOW_HTTP``, ``AWS_SKIP_SIGNATURE``.
    GCS: ``GOOGLE_SERVICE_ACCOUNT`` / ``GOOGLE_SERVICE_ACCOUNT_PATH``,
    ``GOOGLE_SERVICE_ACCOUNT_KEY``, ``GOOGLE_APPLICATION_CREDENTIALS``.
    Raises :class:`InvalidArgument` for a boolean variable that is not one.
    """
    env = os.environ if environ is None else environ
    path_style = _env_bool(env, "AWS_S3_FORCE_PATH_STYLE")
    if path_style is None:
        virtual = _env_bool(env, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
        path_style = None if virtual is None else not virtual
    return ObjectStoreOptions(
        endpoint=_env_first(env, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
        region=_env_first(env, "AWS_REGION", "AWS_DEFAULT_REGION"),
        path_style=path_style,
        access_key_id=_env_first(env, "AWS_ACCESS_KEY_ID"),
        secret_access_key=_env_first(env, "AWS_SECRET_ACCESS_KEY"),
        session_token=_env_first(env, "AWS_SESSION_TOKEN"),
        allow_http=_env_bool(env, "AWS_ALLOW_HTTP"),
        skip_signature=_env_bool(env, "AWS_SKIP_SIGNATURE"),
        service_account_path=_env_first(
            env, "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH"
        ),
        service_account_key=_env_first(env, "GOOGLE_SERVICE_ACCOUNT_KEY"),
        application_credentials=_env_first(env, "GOOGLE_APPLICATION_CREDENTIALS"),
    )


# --- URLs -------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class _Parsed:
    scheme: str
    bucket: str
    path: str


def _parse(url: str) -> _Parsed:
    if not isinstance(url, str) or not url:
        raise InvalidArgument("object store URL is required")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidArgument(
            f"unsupported object store URL {url!r}: use file:///dir, memory://, "
            "s3://bucket/prefix or gs://bucket/prefix"
        )
    if parts.query or parts.fragment:
        raise InvalidArgument(f"object store URL {url!r} must not have a query or fragment")
    path = unquote(parts.path)
    if any(seg in {".", ".."} for seg in path.split("/")):
        raise InvalidArgument(f"object store URL {url!r} must not contain '.' or '..'")
    match scheme:
        case "file":
            if parts.netloc not in {"", "localhost"}:
                raise InvalidArgument(f"file URL {url!r} must be file:///absolute/path")
            return _Parsed("file", "", path or "/")
        case "memory":
            if parts.netloc:
                raise InvalidArgument(f"memory URL {url!r} must be memory:// or memory:///p")
            return _Parsed("memory", "", path.strip("/"))
        case _:
            if not parts.netloc:
                raise InvalidArgument(f"{scheme} URL {url!r} must name a bucket")
            return _Parsed(scheme, parts.netloc, path.strip("/"))


def split_uri(uri: str, root: str | None = None) -> tuple[str, str]:
    """Split a full object URI into ``(store root URL, key under that root)``.

    Without ``root``: ``s3://b/p/k`` → ``("s3://b", "p/k")``, ``gs://b/k`` →
    ``("gs://b", "k")``, ``memory:///p/k`` → ``("memory://", "p/k")`` and
    ``file:///var/lib/x/k`` → ``("file:///", "var/lib/x/k")``. With ``root`` (a location
    URL such as ``file:///var/lib/ate/objects``) the key is relative to it instead, and
    ``uri`` must lie under it. A trailing ``/`` of ``uri`` is kept (a snapshot prefix
    stays a prefix). Raises :class:`InvalidArgument` for an unsupported or malformed URI
    or one outside ``root``.
    """
    parsed = _parse(uri)
    trailing = "/" if uri.endswith("/") and not uri.endswith("://") else ""
    if root is not None:
        base = _parse(root)
        if (base.scheme, base.bucket) != (parsed.scheme, parsed.bucket):
            raise InvalidArgument(f"object URI {uri!r} is not under {root!r}")
        base_path = base.path.rstrip("/")
        path = parsed.path.rstrip("/")
        if base_path and path != base_path and not path.startswith(base_path + "/"):
            raise InvalidArgument(f"object URI {uri!r} is not under {root!r}")
        key = path[len(base_path) :].strip("/")
        return _root_url(base), key + trailing if key else ""
    if parsed.scheme == "file":
        key = parsed.path.strip("/")
        return "file:///", key + trailing if key else ""
    bare = _Parsed(parsed.scheme, parsed.bucket, "")
    key = parsed.path.strip("/")
    return _root_url(bare), key + trailing if key else ""


def _root_url(parsed: _Parsed) -> str:
    match parsed.scheme:
        case "file":
            return "file://" + (parsed.path.rstrip("/") or "/")
        case "memory":
            return "memory://" + (f"/{parsed.path}" if parsed.path else "")
        case _:
            tail = f"/{parsed.path}" if parsed.path else ""
            return f"{parsed.scheme}://{parsed.bucket}{tail}"


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def _client_options(o: ObjectStoreOptions) -> ClientConfig:
    allow_http = o.allow_http
    if allow_http is None:
        allow_http = bool(o.endpoint and o.endpoint.lower().startswith("http://"))
    return {
        "allow_http": allow_http,
        "connect_timeout": _seconds(o.connect_timeout or DEFAULT_CONNECT_TIMEOUT),
        "timeout": _seconds(o.timeout or DEFAULT_TIMEOUT),
        "read_timeout": _seconds(o.read_timeout or DEFAULT_READ_TIMEOUT),
    }


def _retry_config(o: ObjectStoreOptions) -> RetryConfig:
    retry_timeout = o.retry_timeout or DEFAULT_RETRY_TIMEOUT
    return {
        "max_retries": DEFAULT_MAX_RETRIES if o.max_retries is None else o.max_retries,
        "retry_timeout": _seconds(retry_timeout),
        "backoff": {
            "init_backoff": _seconds(0.1),
            "max_backoff": _seconds(min(5.0, retry_timeout)),
            "base": 2,
        },
    }


def _s3_store(bucket: str, o: ObjectStoreOptions) -> S3Store:
    if bool(o.access_key_id) != bool(o.secret_access_key):
        raise InvalidArgument("S3 credentials need both an access key id and a secret key")
    config: dict[str, Any] = {}
    if o.endpoint:
        config["endpoint"] = o.endpoint
    if o.region:
        config["region"] = o.region
    if o.path_style is not None:
        config["virtual_hosted_style_request"] = not o.path_style
    if o.access_key_id and o.secret_access_key:
        config["access_key_id"] = o.access_key_id
        config["secret_access_key"] = o.secret_access_key
        if o.session_token:
            config["token"] = o.session_token
    if o.skip_signature is not None:
        config["skip_signature"] = o.skip_signature
    return S3Store(
        bucket,
        config=config,  # type: ignore[arg-type]
        client_options=_client_options(o),
        retry_config=_retry_config(o),
    )


def _gcs_store(bucket: str, o: ObjectStoreOptions) -> GCSStore:
    config: dict[str, Any] = {}
    if o.endpoint:
        config["base_url"] = o.endpoint
    if o.service_account_path:
        config["service_account"] = o.service_account_path
    if o.service_account_key:
        config["service_account_key"] = o.service_account_key
    if o.application_credentials:
        config["application_credentials"] = o.application_credentials
    if o.skip_signature is not None:
        config["skip_signature"] = o.skip_signature
    return GCSStore(
        bucket,
        config=config,  # type: ignore[arg-type]
        client_options=_client_options(o),
        retry_config=_retry_config(o),
    )


def open_blobstore(
    url: str,
    *,
    options: ObjectStoreOptions | None = None,
    from_env: bool = False,
    environ: Mapping[str, str] | None = None,
) -> ObstoreBlobStore:
    """The :class:`~substrate.snapshot.ports.BlobStore` for ``url``; keys are relative to it.

    ``file:///dir`` opens (and creates) a local directory, and empty directories left by
    deletions are removed (below ``dir`` only; never for ``file:///`` itself).
    ``memory://`` is a new, empty in-process store on every call. ``s3://bucket/prefix``
    and ``gs://bucket/prefix`` use ``options``; with ``from_env=True`` any option left
    unset is read from the environment (``environ``, default ``os.environ``; see
    :func:`options_from_env`). Opening does no I/O for remote stores: an unreachable
    store shows up as :class:`Unavailable` on the first call. Raises
    :class:`InvalidArgument` for an unsupported URL or bad options.
    """
    parsed = _parse(url)
    opts = options or ObjectStoreOptions()
    if from_env:
        opts = opts.over(options_from_env(environ))
    chunk_size = opts.chunk_size or DEFAULT_CHUNK_SIZE
    part_concurrency = opts.part_concurrency or DEFAULT_PART_CONCURRENCY
    name = _root_url(parsed)
    prefix = ""
    try:
        match parsed.scheme:
            case "file":
                directory = parsed.path.rstrip("/") or "/"
                store: Any = LocalStore(
                    prefix=directory, mkdir=True, automatic_cleanup=directory != "/"
                )
            case "memory":
                store = MemoryStore()
                prefix = parsed.path
            case "s3":
                store = _s3_store(parsed.bucket, opts)
                prefix = parsed.path
            case _:
                store = _gcs_store(parsed.bucket, opts)
                prefix = parsed.path
    except SubstrateError:
        raise
    except Exception as exc:
        error = translate_error(exc, op="open", key="", store=name)
        if not isinstance(error, InvalidArgument):
            error = InvalidArgument(f"cannot open object store {name}: {error.description}")
        raise error from exc
    return ObstoreBlobStore(
        store,
        prefix=normalize_prefix(prefix),
        name=name,
        chunk_size=chunk_size,
        part_concurrency=part_concurrency,
    )


class BlobStores:
    """Opens each store root once and maps full object URIs to ``(store, key)``.

    ``roots`` are known locations (e.g. the configured snapshot location); a URI under one
    of them resolves against the longest such root, any other URI against the root that
    :func:`split_uri` gives it. Stores are cached by root URL, and every ``memory://``
    root shares one in-memory store for the life of this object.
    """

    def __init__(
        self,
        options: ObjectStoreOptions | None = None,
        *,
        from_env: bool = False,
        environ: Mapping[str, str] | None = None,
        roots: Sequence[str] = (),
    ) -> None:
        self._options = options
        self._from_env = from_env
        self._environ = environ
        self._roots = sorted((_root_url(_parse(r)) for r in roots), key=len, reverse=True)
        self._stores: dict[str, ObstoreBlobStore] = {}

    def store(self, root: str) -> ObstoreBlobStore:
        """The store opened on ``root`` (opened on first use, then cached)."""
        parsed = _parse(root)
        key = _root_url(parsed)
        store = self._stores.get(key)
        if store is None:
            if parsed.scheme == "memory" and parsed.path:
                # One process-local memory store per BlobStores: roots below it share it.
                shared = self.store("memory://")
                store = ObstoreBlobStore(shared.raw, prefix=normalize_prefix(parsed.path), name=key)
            else:
                store = open_blobstore(
                    key, options=self._options, from_env=self._from_env, environ=self._environ
                )
            self._stores[key] = store
        return store

    def resolve(self, uri: str) -> tuple[ObstoreBlobStore, str]:
        """``(store, key)`` for a full object URI (a trailing ``/`` stays on the key)."""
        for root in self._roots:
            try:
                root_url, key = split_uri(uri, root)
            except InvalidArgument:
                continue
            return self.store(root_url), key
        root_url, key = split_uri(uri)
        return self.store(root_url), key


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_RETRY_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "SCHEMES",
    "BlobStores",
    "ObjectStoreOptions",
    "open_blobstore",
    "options_from_env",
    "split_uri",
]
