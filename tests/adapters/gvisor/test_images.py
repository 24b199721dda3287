"""Local images: building the counter image, resolving references, unpacking safely."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from substrate.adapters.gvisor.images import (
    BUILD_STAMP,
    COUNTER_ENTRYPOINT,
    IMAGE_CONFIG,
    ImageConfig,
    LocalImages,
    build_counter_image,
    image_config_from_json,
    image_config_to_json,
    image_dir_names,
    is_static_elf,
    pack_image,
    parse_image_config,
    read_image_config,
    unpack_rootfs,
)
from substrate.errors import InvalidArgument, NotFound, Unavailable
from substrate.images import counter_source
from substrate.sandbox.images import ImageConfig as SandboxImageConfig

BUSYBOX = shutil.which("busybox") or "/usr/bin/busybox"
CAN_BUILD = bool(shutil.which("gcc")) and os.path.isfile(BUSYBOX) and is_static_elf(BUSYBOX)
needs_build = pytest.mark.skipif(
    not CAN_BUILD, reason="needs gcc with static glibc and busybox-static"
)


def make_image(
    root: Path, name: str = "tiny_1", *, config: dict[str, object] | None = None
) -> Path:
    """A small hand-made image directory."""
    image = root / name
    rootfs = image / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (rootfs / "bin" / "app").write_bytes(b"\x7fELF fake")
    os.chmod(rootfs / "bin" / "app", 0o755)
    (rootfs / "etc" / "motd").write_text("hello\n")
    os.symlink("app", rootfs / "bin" / "alias")
    os.symlink("/etc/motd", rootfs / "etc" / "abs-link")
    (image / IMAGE_CONFIG).write_text(
        json.dumps(
            config or {"entrypoint": ["/bin/app"], "cmd": ["-v"], "env": ["A=1"], "runtime": {}}
        )
    )
    return image


def tree(root: Path) -> dict[str, str]:
    """A comparable description of a directory tree (type, link target, content, mode)."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = f"{path.read_bytes()!r} {oct(path.stat().st_mode & 0o777)}"
    return found


# --- image.json -------------------------------------------------------------------------


def test_image_config_round_trip() -> None:
    raw = (
        b'{"entrypoint": ["/bin/app"], "cmd": ["a", "b"], "env": ["K=V", "E=", "X=a=b"],'
        b' "runtime": {"x": 1}}'
    )
    config = parse_image_config(raw)
    assert isinstance(config, SandboxImageConfig)  # one record: the image port's
    assert config.args == ("/bin/app", "a", "b")
    assert config.env == (("K", "V"), ("E", ""), ("X", "a=b"))
    assert config.runtime["x"] == 1
    assert image_config_to_json(config) == json.loads(raw)
    assert image_config_from_json(image_config_to_json(config)) == config
    assert parse_image_config(b"{}") == ImageConfig()
    # the bundle marker form keeps the runtime hints too
    assert SandboxImageConfig.from_json(config.to_json()).runtime == {"x": 1}


def test_image_json_is_written_as_before(tmp_path: Path) -> None:
    """``image.json`` keeps its format: env as ``NAME=value`` strings, ``runtime`` last."""
    config = ImageConfig(entrypoint=("/bin/app",), env=(("PATH", "/bin"), ("A", "x=y")))
    assert json.dumps(image_config_to_json(config)) == (
        '{"entrypoint": ["/bin/app"], "cmd": [], "env": ["PATH=/bin", "A=x=y"], "runtime": {}}'
    )
    image = make_image(
        tmp_path, config={"entrypoint": ["/bin/app"], "env": ["A=1"], "runtime": {"k": [1]}}
    )
    with tarfile.open(pack_image(image, tmp_path / "packed.tar")) as tar:
        handle = tar.extractfile(IMAGE_CONFIG)
        assert handle is not None
        packed = json.loads(handle.read())
    assert packed == {"entrypoint": ["/bin/app"], "cmd": [], "env": ["A=1"], "runtime": {"k": [1]}}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "image.json is not valid JSON"),
        (b"[]", "image.json must hold a JSON object"),
        (b'{"entrypoint": "/bin/app"}', "image.json: 'entrypoint' must be a list of strings"),
        (b'{"cmd": [1]}', "image.json: image cmd entry 1 is not a string"),
        (b'{"env": ["NOEQUALS"]}', "image.json: image env entry 'NOEQUALS' is not NAME=value"),
        (b'{"env": ["=x"]}', "image.json: image env entry '=x' is not NAME=value"),
        (b'{"runtime": []}', "image.json: 'runtime' must be an object"),
    ],
)
def test_bad_image_config_is_invalid(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_image_config(raw)
    assert caught.value.description.startswith(message)


# --- references -------------------------------------------------------------------------


def test_image_dir_names() -> None:
    assert image_dir_names("counter:1") == ("counter_1",)
    assert image_dir_names("local/counter:1") == ("local_counter_1", "counter_1")
    assert image_dir_names("registry.local/team/app:v2") == ("registry.local_team_app_v2", "app_v2")
    assert image_dir_names("counter") == ("counter_latest",)
    assert image_dir_names("app@sha256:abc") == ("app_sha256_abc",)


@pytest.mark.parametrize(
    "ref", ["", "../x:1", "a/../b:1", "/abs:1", "a//b:1", "sp ace:1", "a\x00:1"]
)
def test_bad_references_are_invalid(ref: str) -> None:
    with pytest.raises(InvalidArgument):
        image_dir_names(ref)


def test_resolve_prefers_directories_then_tarballs(tmp_path: Path) -> None:
    images = LocalImages(tmp_path)
    with pytest.raises(NotFound, match="counter:1"):
        images.resolve("local/counter:1")
    image = make_image(tmp_path, "counter_1")
    assert images.resolve("counter:1") == image
    assert images.resolve("local/counter:1") == image  # by its last component
    assert images.path_for("local/counter:1") == tmp_path / "local_counter_1"
    pack_image(image, tmp_path / "other_2.tar")
    assert images.resolve("other:2") == tmp_path / "other_2.tar"
    assert images.config("other:2").args == ("/bin/app", "-v")
    (tmp_path / "broken_1").mkdir()  # no image.json, no rootfs: not an image
    with pytest.raises(NotFound):
        images.resolve("broken:1")


# --- unpacking --------------------------------------------------------------------------


def test_unpack_a_directory_hard_links(tmp_path: Path) -> None:
    image = make_image(tmp_path / "images")
    bundle = tmp_path / "bundle"
    config = unpack_rootfs(image, bundle)
    assert config.entrypoint == ("/bin/app",)
    assert tree(bundle / "rootfs") == tree(image / "rootfs")
    src, dst = image / "rootfs" / "bin" / "app", bundle / "rootfs" / "bin" / "app"
    assert os.stat(src).st_ino == os.stat(dst).st_ino, "same file system: hard links"
    # unpacking again replaces the rootfs and leaves no staging directory behind
    (bundle / "rootfs" / "stale").write_text("x")
    unpack_rootfs(image, bundle)
    assert not (bundle / "rootfs" / "stale").exists()
    assert sorted(p.name for p in bundle.iterdir()) == ["rootfs"]


def test_unpack_a_tarball(tmp_path: Path) -> None:
    image = make_image(tmp_path / "images")
    tarball = pack_image(image, tmp_path / "images" / "tiny_1.tar")
    config = unpack_rootfs(tarball, tmp_path / "bundle")
    assert config == read_image_config(image)
    assert tree(tmp_path / "bundle" / "rootfs") == tree(image / "rootfs")


def test_unpack_a_missing_image(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        unpack_rootfs(tmp_path / "nothing", tmp_path / "bundle")
    (tmp_path / "noconf" / "rootfs").mkdir(parents=True)
    with pytest.raises(NotFound, match=IMAGE_CONFIG):
        unpack_rootfs(tmp_path / "noconf", tmp_path / "bundle")


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        config = b'{"entrypoint": ["/bin/app"]}'
        info = tarfile.TarInfo(IMAGE_CONFIG)
        info.size = len(config)
        tar.addfile(info, io.BytesIO(config))
        for member, data in members:
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data else None)
    return path


def _file(name: str, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, b"data"


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, b""


def _dir(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, b""


@pytest.mark.parametrize(
    "members",
    [
        pytest.param([_file("/etc/passwd")], id="absolute"),
        pytest.param([_file("rootfs/../../escape")], id="dotdot"),
        pytest.param([_file("rootfs/bin/../../../escape")], id="dotdot-inside"),
        pytest.param(
            [_link("rootfs/out", "/tmp"), _file("rootfs/out/escape")], id="through-symlink"
        ),
        pytest.param(
            [_link("rootfs/up", ".."), _dir("rootfs/d"), _file("rootfs/up/escape")],
            id="through-relative-symlink",
        ),
        pytest.param([_link("rootfs/hl", "/etc/passwd", tarfile.LNKTYPE)], id="hardlink-absolute"),
        pytest.param([_link("rootfs/hl", "image.json", tarfile.LNKTYPE)], id="hardlink-outside"),
        pytest.param([_link("rootfs/hl", "rootfs/../x", tarfile.LNKTYPE)], id="hardlink-dotdot"),
    ],
)
def test_tar_traversal_is_refused(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]
) -> None:
    tarball = _tar(tmp_path / "evil.tar", members)
    bundle = tmp_path / "work" / "bundle"
    with pytest.raises(InvalidArgument):
        unpack_rootfs(tarball, bundle)
    assert not (tmp_path / "work" / "escape").exists()
    assert not (tmp_path / "escape").exists()
    assert not (bundle / "rootfs").exists(), "nothing half-extracted is left in place"
    assert [p.name for p in bundle.iterdir()] == [], "no staging directory is left behind"


def test_tar_members_are_sanitized(tmp_path: Path) -> None:
    dev = tarfile.TarInfo("rootfs/dev/null")
    dev.type = tarfile.CHRTYPE
    tarball = _tar(
        tmp_path / "ok.tar",
        [
            _dir("./rootfs/bin"),
            _file("./rootfs/bin/app", 0o4755),  # set-uid is dropped
            _link("rootfs/bin/alias", "app"),
            _link("rootfs/bin/hard", "rootfs/bin/app", tarfile.LNKTYPE),
            _link("rootfs/etc-link", "/etc"),  # an absolute symlink is fine: never followed here
            _file("other/ignored"),
            (dev, b""),
        ],
    )
    unpack_rootfs(tarball, tmp_path / "bundle")
    rootfs = tmp_path / "bundle" / "rootfs"
    assert oct((rootfs / "bin" / "app").stat().st_mode & 0o7777) == oct(0o755)
    assert os.readlink(rootfs / "bin" / "alias") == "app"
    assert os.readlink(rootfs / "etc-link") == "/etc"
    assert (rootfs / "bin" / "hard").stat().st_ino == (rootfs / "bin" / "app").stat().st_ino
    assert not (rootfs / "dev").exists()
    assert not (tmp_path / "bundle" / "other").exists()


def test_tar_without_image_json_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "noconf.tar"
    with tarfile.open(path, "w") as tar:
        info, data = _file("rootfs/x")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(InvalidArgument, match=IMAGE_CONFIG):
        unpack_rootfs(path, tmp_path / "bundle")


def test_not_a_tar_is_invalid(tmp_path: Path) -> None:
    (tmp_path / "junk.tar").write_bytes(b"junk" * 100)
    with pytest.raises(InvalidArgument):
        unpack_rootfs(tmp_path / "junk.tar", tmp_path / "bundle")


# --- the counter image --------------------------------------------------------------------


def test_counter_source_ships_as_package_data() -> None:
    source = counter_source()
    assert b"count=%llu boot=%s" in source
    assert b"/run/ate/atespace" in source


@needs_build
def test_is_static_elf(tmp_path: Path) -> None:
    assert is_static_elf(BUSYBOX)
    (tmp_path / "dyn.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-o", str(tmp_path / "dyn"), str(tmp_path / "dyn.c")], check=True)
    assert not is_static_elf(tmp_path / "dyn")
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert not is_static_elf(tmp_path / "text")


@needs_build
def test_build_counter_image(tmp_path: Path) -> None:
    image = build_counter_image(tmp_path / "counter_1")
    rootfs = image / "rootfs"
    assert read_image_config(image).entrypoint == COUNTER_ENTRYPOINT
    assert is_static_elf(rootfs / "bin" / "counter")
    assert is_static_elf(rootfs / "bin" / "busybox")
    assert os.readlink(rootfs / "bin" / "sh") == "busybox"
    for name in ("dev", "proc", "sys", "tmp", "etc", "run", "run/ate"):
        assert (rootfs / name).is_dir(), name
    # up to date: not rebuilt
    inode = (rootfs / "bin" / "counter").stat().st_ino
    assert build_counter_image(tmp_path / "counter_1") == image
    assert (rootfs / "bin" / "counter").stat().st_ino == inode
    # another source (or layout): rebuilt
    stamp = json.loads((image / BUILD_STAMP).read_text())
    (image / BUILD_STAMP).write_text(json.dumps({**stamp, "source_sha256": "0" * 64}))
    build_counter_image(tmp_path / "counter_1")
    assert (image / "rootfs" / "bin" / "counter").stat().st_ino != inode
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "counter_1"
    ]
    assert LocalImages(tmp_path).resolve("local/counter:1") == image


def test_build_without_a_compiler_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="compiler"):
        build_counter_image(tmp_path / "c", cc="/nonexistent/cc")
    assert not (tmp_path / "c").exists()


@needs_build
def test_build_without_busybox_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="busybox"):
        build_counter_image(tmp_path / "c", busybox=str(tmp_path / "no-busybox"))
