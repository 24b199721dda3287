"""Local workload images for the gVisor runtime: directories or tarballs, no registries.

An image is a directory holding ``rootfs/`` (the root filesystem) and ``image.json``::

    {"entrypoint": ["/bin/counter"], "cmd": [], "env": ["K=V"], "runtime": {}}

or a ``.tar`` (optionally compressed) of the same two entries. :class:`LocalImages` finds
the image of a reference such as ``counter:1`` below one directory;
:func:`unpack_rootfs` puts its root filesystem into a bundle as ``<bundle>/rootfs``
(hard links where possible — the sandbox mounts the rootfs read-only — else reflinks,
else copies; tarballs are extracted member by member, refusing any path that would land
outside the rootfs). :func:`build_counter_image` compiles the conformance workload
(:mod:`substrate.images`) statically into such an image, next to a static busybox.

Everything here blocks (file system, compiler): call it from a worker thread in async
code. Nothing runs at import, so the module imports on machines without gcc or busybox.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import stat
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Final

from substrate.errors import Internal, InvalidArgument, NotFound, Unavailable
from substrate.images import counter_source
from substrate.sandbox.images import ImageConfig

IMAGE_CONFIG: Final = "image.json"
ROOTFS: Final = "rootfs"
TAR_SUFFIX: Final = ".tar"
COUNTER_BINARY: Final = "/bin/counter"
COUNTER_ENTRYPOINT: Final = (COUNTER_BINARY,)
ROOTFS_DIRS: Final = ("bin", "dev", "proc", "sys", "tmp", "etc", "run", "run/ate")
"""Directories of a built rootfs (``/run/ate`` is the mount point of the actor's info)."""
BUILD_STAMP: Final = ".build.json"
"""What the image directory was built from (not part of the image format)."""
LAYOUT_VERSION: Final = "counter-image/1"
"""Bump when :func:`build_counter_image` lays the image out differently."""
CFLAGS: Final = ("-static", "-O2", "-Wall", "-Wextra")
DEFAULT_BUSYBOX: Final = "/usr/bin/busybox"
FICLONE: Final = 0x40049409
"""ioctl(FICLONE): share the source file's extents (btrfs, xfs); EOPNOTSUPP elsewhere."""

_REF_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
_UNSAFE_RE: Final = re.compile(r"[^A-Za-z0-9._-]")
_LINK_ERRORS: Final = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES})


# --- the image config -------------------------------------------------------------------
#
# ``image.json`` holds a :class:`~substrate.sandbox.images.ImageConfig` with ``env`` as
# ``NAME=value`` strings; these two functions are the only translation.


def _check_strings(source: str, key: str, value: list[Any]) -> None:
    for item in value:
        if not isinstance(item, str) or "\x00" in item:
            raise InvalidArgument(f"{source}: image {key} entry {item!r} is not a string")


def image_config_from_json(data: object, *, source: str = IMAGE_CONFIG) -> ImageConfig:
    """The config of a decoded ``image.json``; :class:`InvalidArgument` if it is malformed."""
    if not isinstance(data, dict):
        raise InvalidArgument(f"{source} must hold a JSON object")
    runtime = data.get("runtime")
    runtime = {} if runtime is None else runtime
    if not isinstance(runtime, dict):
        raise InvalidArgument(f"{source}: 'runtime' must be an object")
    fields: dict[str, list[Any]] = {}
    for key in ("entrypoint", "cmd", "env"):
        value = data.get(key)
        value = [] if value is None else value
        if not isinstance(value, list):
            raise InvalidArgument(f"{source}: {key!r} must be a list of strings")
        fields[key] = value
    for key, items in fields.items():
        _check_strings(source, key, items)
    env: list[tuple[str, str]] = []
    for item in fields["env"]:
        if "=" not in item or item.startswith("="):
            raise InvalidArgument(f"{source}: image env entry {item!r} is not NAME=value")
        name, _, text = item.partition("=")
        env.append((name, text))
    try:
        return ImageConfig(
            entrypoint=fields["entrypoint"], cmd=fields["cmd"], env=env, runtime=runtime
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"{source}: {exc.description}") from exc


def image_config_to_json(config: ImageConfig) -> dict[str, Any]:
    """``config`` as ``image.json`` holds it (``env`` as ``NAME=value`` strings)."""
    return {
        "entrypoint": list(config.entrypoint),
        "cmd": list(config.cmd),
        "env": [f"{name}={value}" for name, value in config.env],
        "runtime": dict(config.runtime),
    }


def parse_image_config(raw: bytes, *, source: str = IMAGE_CONFIG) -> ImageConfig:
    """:class:`ImageConfig` from the bytes of ``image.json``."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(f"{source} is not valid JSON: {exc}") from exc
    return image_config_from_json(data, source=source)


def read_image_config(image: str | os.PathLike[str]) -> ImageConfig:
    """The config of the image directory or tarball ``image``."""
    path = Path(image)
    if path.is_dir():
        try:
            raw = (path / IMAGE_CONFIG).read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"image {path} has no {IMAGE_CONFIG}") from exc
        return parse_image_config(raw, source=str(path / IMAGE_CONFIG))
    with _open_tar(path) as tar:
        for member in tar:
            if _member_name(member.name) == IMAGE_CONFIG and member.isfile():
                return parse_image_config(
                    _read_member(tar, member), source=f"{path}:{IMAGE_CONFIG}"
                )
    raise NotFound(f"image {path} has no {IMAGE_CONFIG}")


# --- resolving references ---------------------------------------------------------------


def image_dir_names(ref: str) -> tuple[str, ...]:
    """The directory names an image reference may live under, most specific first.

    ``registry.local/counter:1`` → ``registry.local_counter_1``, then ``counter_1``;
    ``counter`` → ``counter_latest``. Raises :class:`InvalidArgument` for a malformed
    reference.
    """
    if not isinstance(ref, str) or not ref or len(ref) > 255 or not _REF_RE.match(ref):
        raise InvalidArgument(f"image reference {ref!r} is invalid")
    if any(part in ("", ".", "..") for part in ref.split("/")):
        raise InvalidArgument(f"image reference {ref!r} is invalid")
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last:
        ref, last = ref + ":latest", last + ":latest"
    names = [_UNSAFE_RE.sub("_", ref), _UNSAFE_RE.sub("_", last)]
    return tuple(dict.fromkeys(names))


class LocalImages:
    """Images kept below one directory, by reference (see :func:`image_dir_names`).

    ``<root>/<name>/`` (a directory with ``rootfs/`` and ``image.json``) wins over
    ``<root>/<name>.tar``.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root)

    @property
    def root(self) -> Path:
        return self._root

    def path_for(self, ref: str) -> Path:
        """Where the image directory of ``ref`` belongs (whether or not it exists)."""
        return self._root / image_dir_names(ref)[0]

    def resolve(self, ref: str) -> Path:
        """The image directory or tarball of ``ref``; :class:`NotFound` if there is none."""
        tried: list[str] = []
        for name in image_dir_names(ref):
            directory = self._root / name
            if (directory / IMAGE_CONFIG).is_file() and (directory / ROOTFS).is_dir():
                return directory
            tarball = self._root / (name + TAR_SUFFIX)
            if tarball.is_file():
                return tarball
            tried += [str(directory) + "/", str(tarball)]
        raise NotFound(f"image {ref!r} not found in {self._root} (looked for {', '.join(tried)})")

    def config(self, ref: str) -> ImageConfig:
        return read_image_config(self.resolve(ref))

    def unpack(self, ref: str, bundle_dir: str | os.PathLike[str]) -> ImageConfig:
        """:func:`unpack_rootfs` of the image of ``ref``."""
        return unpack_rootfs(self.resolve(ref), bundle_dir)


# --- unpacking --------------------------------------------------------------------------


def unpack_rootfs(image: str | os.PathLike[str], bundle_dir: str | os.PathLike[str]) -> ImageConfig:
    """Put ``image``'s root filesystem at ``<bundle_dir>/rootfs``; return its config.

    A rootfs already there is replaced. From a directory the files are hard-linked
    (reflinked or copied across file systems); never write to them on the host.
    From a tarball, members outside ``rootfs/`` other than ``image.json`` are ignored,
    device nodes are skipped, set-id bits dropped, and any member that would land outside
    the rootfs (absolute or ``..`` paths, paths through a symlink, hard links out) makes
    it fail with :class:`InvalidArgument`.
    """
    source = Path(image)
    bundle = Path(bundle_dir)
    if not source.exists():
        raise NotFound(f"image {source} does not exist")
    bundle.mkdir(parents=True, exist_ok=True)
    staging = bundle / f".{ROOTFS}-{secrets.token_hex(4)}"
    try:
        if source.is_dir():
            config = read_image_config(source)
            rootfs = source / ROOTFS
            if not rootfs.is_dir():
                raise NotFound(f"image {source} has no {ROOTFS}/ directory")
            staging.mkdir(mode=0o755)
            _Copier().tree(rootfs, staging)
        else:
            config = _extract_tar(source, staging)
        _replace_dir(staging, bundle / ROOTFS)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return config


def _replace_dir(new: Path, target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        old = target.with_name(f".{target.name}-old-{secrets.token_hex(4)}")
        target.rename(old)
        new.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return
    new.rename(target)


class _Copier:
    """Copies a tree with hard links, falling back to reflinks, then to plain copies."""

    def __init__(self) -> None:
        self.link = True

    def tree(self, src: Path, dst: Path) -> None:
        with os.scandir(src) as entries:
            for entry in entries:
                target = dst / entry.name
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), target)
                elif entry.is_dir(follow_symlinks=False):
                    target.mkdir()
                    self.tree(Path(entry.path), target)
                    shutil.copystat(entry.path, target, follow_symlinks=False)
                elif entry.is_file(follow_symlinks=False):
                    self.file(Path(entry.path), target)
                # sockets, fifos, devices: not part of a root filesystem image

    def file(self, src: Path, dst: Path) -> None:
        if self.link:
            try:
                os.link(src, dst)
                return
            except OSError as exc:
                if exc.errno not in _LINK_ERRORS:
                    raise
                self.link = False
        with open(src, "rb") as fin, open(dst, "xb") as fout:
            try:
                fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
            except OSError:
                shutil.copyfileobj(fin, fout, 1 << 20)
        shutil.copystat(src, dst)


def _member_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _open_tar(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except FileNotFoundError as exc:
        raise NotFound(f"image {path} does not exist") from exc
    except (tarfile.TarError, OSError) as exc:
        raise InvalidArgument(f"image {path} is not a readable tar archive: {exc}") from exc


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        raise InvalidArgument(f"tar member {member.name!r} cannot be read")
    with handle:
        return handle.read()


def _rootfs_relative(name: str, *, what: str) -> str | None:
    """The path below ``rootfs/`` of a member name; None if outside; raises on traversal."""
    if name.startswith("/") or "\x00" in name:
        raise InvalidArgument(f"tar {what} {name!r} is absolute; refusing to extract")
    parts = _member_name(name).split("/")
    if ".." in parts:
        raise InvalidArgument(f"tar {what} {name!r} leaves the root filesystem; refusing")
    parts = [p for p in parts if p not in ("", ".")]
    if not parts or parts[0] != ROOTFS:
        return None
    return "/".join(parts[1:])


def _safe_parent(root: Path, rel: str) -> Path:
    """``root/rel``'s parent, created as real directories; refuses to pass through links."""
    current = root
    for part in rel.split("/")[:-1]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            current.mkdir(mode=0o755)
            continue
        if not stat.S_ISDIR(mode):
            raise InvalidArgument(
                f"tar member {ROOTFS}/{rel} would be written through {current.relative_to(root)}, "
                "which is not a directory; refusing to extract"
            )
    return current


def _clear(path: Path) -> None:
    """Remove what an earlier member put at ``path`` (a later member replaces it)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise InvalidArgument(f"tar member {path.name!r} would replace a directory")
    path.unlink()


def _extract_tar(path: Path, dest: Path) -> ImageConfig:
    config: ImageConfig | None = None
    dest.mkdir(mode=0o755)
    dir_modes: list[tuple[Path, int]] = []
    with _open_tar(path) as tar:
        for member in tar:
            if _member_name(member.name) == IMAGE_CONFIG and member.isfile():
                config = parse_image_config(
                    _read_member(tar, member), source=f"{path}:{IMAGE_CONFIG}"
                )
                continue
            rel = _rootfs_relative(member.name, what="member")
            if not rel:  # outside rootfs/, or rootfs/ itself
                continue
            if not (member.isdir() or member.isreg() or member.issym() or member.islnk()):
                continue  # device nodes, fifos: the sandbox brings its own /dev
            parent = _safe_parent(dest, rel)
            target = parent / rel.rsplit("/", 1)[-1]
            mode = member.mode & 0o777
            if member.isdir():
                with contextlib.suppress(FileExistsError):
                    target.mkdir(mode=0o755)
                if not target.is_dir() or target.is_symlink():
                    raise InvalidArgument(f"tar member {member.name!r} is not a directory here")
                dir_modes.append((target, (member.mode & 0o1777) | 0o700))
            elif member.isreg():
                _clear(target)
                _write_member(tar, member, target, mode)
            elif member.issym():
                _clear(target)
                os.symlink(member.linkname, target)
            elif member.islnk():
                link_rel = _rootfs_relative(member.linkname, what="hard link target")
                if not link_rel:
                    raise InvalidArgument(
                        f"tar hard link {member.name!r} -> {member.linkname!r} points outside "
                        f"{ROOTFS}/; refusing to extract"
                    )
                source = _safe_parent(dest, link_rel) / link_rel.rsplit("/", 1)[-1]
                if not stat.S_ISREG(os.lstat(source).st_mode):
                    raise InvalidArgument(f"tar hard link {member.name!r} is not to a file")
                _clear(target)
                os.link(source, target)
    for directory, mode in reversed(dir_modes):
        os.chmod(directory, mode)
    if config is None:
        raise InvalidArgument(f"image {path} has no {IMAGE_CONFIG}")
    return config


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, mode: int) -> None:
    handle = tar.extractfile(member)
    if handle is None:
        raise InvalidArgument(f"tar member {member.name!r} cannot be read")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(target, flags, 0o600)
    with handle, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(handle, out, 1 << 20)
        os.fchmod(out.fileno(), mode)


def pack_image(image_dir: str | os.PathLike[str], tar_path: str | os.PathLike[str]) -> Path:
    """Write the image directory ``image_dir`` as the tarball ``tar_path`` (uncompressed)."""
    source = Path(image_dir)
    config = read_image_config(source)  # refuse to pack something that is not an image
    target = Path(tar_path)
    staging = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
    try:
        with tarfile.open(staging, "w", format=tarfile.PAX_FORMAT) as tar:
            raw = json.dumps(image_config_to_json(config), indent=1).encode()
            info = tarfile.TarInfo(IMAGE_CONFIG)
            info.size = len(raw)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(raw))
            tar.add(source / ROOTFS, arcname=ROOTFS, recursive=True)
        os.replace(staging, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
    return target


# --- building the counter image ----------------------------------------------------------


def counter_source_digest() -> str:
    """sha256 of the counter source and the image layout: the build cache key."""
    digest = hashlib.sha256(counter_source())
    digest.update(LAYOUT_VERSION.encode())
    return digest.hexdigest()


def build_counter_image(
    dest_dir: str | os.PathLike[str], *, cc: str = "gcc", busybox: str | None = None
) -> Path:
    """Build the counter workload image at ``dest_dir``; return it.

    Compiles :mod:`substrate.images`' ``counter.c`` with ``cc -static`` into
    ``rootfs/bin/counter``, copies a static busybox to ``rootfs/bin/busybox`` with a
    symlink per applet, adds ``dev proc sys tmp etc run run/ate`` and writes
    ``image.json`` (entrypoint ``/bin/counter``). Skips the build when ``dest_dir``
    already holds a build of the same source. Safe to call from several processes.

    Raises :class:`Unavailable` if the compiler or busybox is missing, and
    :class:`Internal` if the compiler fails.
    """
    dest = Path(dest_dir)
    digest = counter_source_digest()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if _built_from(dest) == digest:
            return dest
        staging = dest.with_name(f".{dest.name}.build-{secrets.token_hex(4)}")
        try:
            _build(staging, digest, cc=cc, busybox=busybox)
            _replace_dir(staging, dest)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return dest


def _built_from(dest: Path) -> str:
    try:
        stamp = json.loads((dest / BUILD_STAMP).read_bytes())
    except (OSError, ValueError):
        return ""
    ok = (dest / ROOTFS / COUNTER_BINARY.lstrip("/")).is_file() and (dest / IMAGE_CONFIG).is_file()
    digest = stamp.get("source_sha256", "") if isinstance(stamp, dict) else ""
    return digest if ok and isinstance(digest, str) else ""


def _build(staging: Path, digest: str, *, cc: str, busybox: str | None) -> None:
    rootfs = staging / ROOTFS
    for name in ROOTFS_DIRS:
        (rootfs / name).mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)
    binary = rootfs / COUNTER_BINARY.lstrip("/")
    try:
        done = subprocess.run(
            [cc, *CFLAGS, "-o", str(binary), "-x", "c", "-"],
            input=counter_source(),
            capture_output=True,
            check=False,
            timeout=300,
        )
    except FileNotFoundError as exc:
        raise Unavailable(f"cannot build the counter image: C compiler {cc!r} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise Internal(f"building the counter image: {cc} timed out") from exc
    if done.returncode != 0:
        text = done.stderr.decode(errors="replace").strip()[-2000:]
        raise Internal(f"building the counter image: {cc} failed (exit {done.returncode}): {text}")
    _install_busybox(rootfs, busybox)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    config = ImageConfig(entrypoint=COUNTER_ENTRYPOINT)
    (staging / IMAGE_CONFIG).write_text(json.dumps(image_config_to_json(config), indent=1) + "\n")
    (staging / BUILD_STAMP).write_text(json.dumps({"source_sha256": digest, "cc": cc}) + "\n")


def _install_busybox(rootfs: Path, busybox: str | None) -> None:
    path = busybox or shutil.which("busybox") or DEFAULT_BUSYBOX
    if not os.path.isfile(path):
        raise Unavailable(
            "cannot build the counter image: busybox not found (install busybox-static)"
        )
    if not is_static_elf(path):
        raise Unavailable(
            f"cannot build the counter image: {path} is dynamically linked (install busybox-static)"
        )
    bindir = rootfs / "bin"
    shutil.copy2(path, bindir / "busybox")
    try:
        listed = subprocess.run(
            [path, "--list"], capture_output=True, check=True, timeout=30
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError) as exc:
        raise Internal(f"cannot list busybox applets of {path}: {exc}") from exc
    for applet in sorted(set(listed.split())):
        if "/" in applet or applet in ("busybox", ".", ".."):
            continue
        link = bindir / applet
        if not link.exists() and not link.is_symlink():
            os.symlink("busybox", link)


def is_static_elf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ELF executable without a program interpreter (PT_INTERP)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF":
            return False
        endian = "<" if head[5] == 1 else ">"
        if head[4] == 2:  # ELFCLASS64
            (phoff,) = struct.unpack_from(endian + "Q", head, 32)
            phentsize, phnum = struct.unpack_from(endian + "HH", head, 54)
        else:
            (phoff,) = struct.unpack_from(endian + "I", head, 28)
            phentsize, phnum = struct.unpack_from(endian + "HH", head, 42)
        for index in range(phnum):
            f.seek(phoff + index * phentsize)
            entry = f.read(4)
            if len(entry) < 4:
                return False
            if struct.unpack(endian + "I", entry)[0] == 3:  # PT_INTERP
                return False
    return True


__all__ = [
    "COUNTER_ENTRYPOINT",
    "IMAGE_CONFIG",
    "ROOTFS",
    "ImageConfig",
    "LocalImages",
    "build_counter_image",
    "counter_source_digest",
    "image_config_from_json",
    "image_config_to_json",
    "image_dir_names",
    "is_static_elf",
    "pack_image",
    "parse_image_config",
    "read_image_config",
    "unpack_rootfs",
]
