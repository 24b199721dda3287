"""SandboxSpec and the records a runtime reports."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from substrate.core.ids import TemplateRef
from substrate.core.model import (
    ActorTemplate,
    Container,
    EnvVar,
    Fidelity,
    Probe,
    Resources,
)
from substrate.errors import InvalidArgument, NotFound
from substrate.sandbox.spec import (
    CheckpointInfo,
    SandboxAddress,
    SandboxSpec,
    SandboxStats,
    netns_path_for,
    sandbox_id_for,
    validate_sandbox_id,
)

UID = "6f1d2c3a-9b7e-4f00-8a11-0123456789ab"


def template(*containers: Container) -> ActorTemplate:
    return ActorTemplate(
        ref=TemplateRef("as1", "web"),
        containers=containers
        or (
            Container(
                name="main",
                image="reg/app:1",
                command=("/app", "--serve"),
                env=(EnvVar(name="A", value="1"),),
                ports=(8080, 9090),
                wakeup_probe=Probe(path="/healthz", port=8080, timeout_seconds=10),
            ),
            Container(name="side", image="reg/side:1", command=("/side",), ports=(7000,)),
        ),
        resources=Resources(cpu_milli=750, memory_bytes=512 << 20),
    )


def test_from_template_takes_the_first_container() -> None:
    spec = SandboxSpec.from_template(
        template(),
        actor_uid=UID,
        bundle_dir="/var/lib/ate/bundles/x",
        netns_path=netns_path_for("gvn-1"),
        address="169.254.17.2",
        device="gvh1",
    )
    assert spec.sandbox_id == f"ate-{UID}"
    assert spec.args == ("/app", "--serve")
    assert spec.env == (EnvVar(name="A", value="1"),)
    assert spec.ports == (8080, 9090)
    assert spec.wakeup_probe == Probe(path="/healthz", port=8080, timeout_seconds=10)
    assert spec.probe_port == 8080
    assert spec.memory_limit_bytes == 512 << 20
    assert spec.cpu_limit_milli == 750
    assert spec.netns_path == "/var/run/netns/gvn-1"
    assert spec.address == "169.254.17.2"
    assert spec.device == "gvh1"
    assert spec.rootfs == "rootfs"
    assert spec.cwd == "/"


def test_from_template_falls_back_to_the_image_entrypoint() -> None:
    t = template(Container(name="main", image="reg/app:1"))
    spec = SandboxSpec.from_template(
        t, actor_uid="u", bundle_dir="/b", netns_path="/n", image_args=["/entry", "cmd"]
    )
    assert spec.args == ("/entry", "cmd")
    assert spec.wakeup_probe is None
    assert spec.probe_port == 80
    with pytest.raises(InvalidArgument, match="no command"):
        SandboxSpec.from_template(t, actor_uid="u", bundle_dir="/b", netns_path="/n")


def test_relocated_keeps_the_sandbox() -> None:
    spec = SandboxSpec.from_template(
        template(), actor_uid=UID, bundle_dir="/b1", netns_path="/n1", device="gvh1"
    )
    moved = spec.relocated(netns_path="/n2", bundle_dir="/b2", device="gvh2")
    assert moved.sandbox_id == spec.sandbox_id
    assert moved.args == spec.args
    assert (moved.netns_path, moved.bundle_dir, moved.device) == ("/n2", "/b2", "gvh2")
    assert spec.relocated(netns_path="/n3").bundle_dir == "/b1"
    assert attrs.evolve(moved, netns_path="/n1", bundle_dir="/b1", device="gvh1") == spec


def test_sandbox_ids() -> None:
    assert sandbox_id_for("abc") == "ate-abc"
    assert validate_sandbox_id("a.b_c-1") == "a.b_c-1"
    for bad in ("", "-a", "a b", "a/b", "ä", "x" * 65):
        with pytest.raises(InvalidArgument):
            validate_sandbox_id(bad)
    with pytest.raises(InvalidArgument):
        sandbox_id_for("")
    with pytest.raises(InvalidArgument):
        sandbox_id_for("x" * 61)


def test_netns_paths() -> None:
    assert netns_path_for("gvn-1") == "/var/run/netns/gvn-1"
    for bad in ("", "a/b", ".", ".."):
        with pytest.raises(InvalidArgument):
            netns_path_for(bad)


def base(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "sandbox_id": "ate-1",
        "bundle_dir": "/b",
        "netns_path": "/var/run/netns/n",
        "args": ("/app",),
    }
    fields.update(changes)
    return fields


@pytest.mark.parametrize(
    "changes",
    [
        {"sandbox_id": "bad id"},
        {"bundle_dir": "relative"},
        {"netns_path": ""},
        {"netns_path": "n"},
        {"args": ()},
        {"args": "/app"},
        {"args": ("a\x00b",)},
        {"cwd": "app"},
        {"rootfs": ""},
        {"ports": (0,)},
        {"ports": (80, 80)},
        {"ports": (True,)},
        {"env": (EnvVar(name="A"), EnvVar(name="A"))},
        {"env": (EnvVar(name="A=B"),)},
        {"device": "this-name-is-too-long"},
        {"device": "a b"},
    ],
)
def test_spec_validation(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        SandboxSpec(**base(**changes))


def test_address() -> None:
    address = SandboxAddress(host="127.0.0.1", ports=[(8080, 40001), (80, 40000)])
    assert address.ports == ((80, 40000), (8080, 40001))
    assert address.host_port(8080) == 40001
    with pytest.raises(NotFound):
        address.host_port(81)
    with pytest.raises(InvalidArgument):
        SandboxAddress(host="h", ports=[(80, 1), (80, 2)])
    with pytest.raises(InvalidArgument):
        SandboxAddress(host="h", ports=[(80, 0)])


def test_checkpoint_info_and_stats() -> None:
    info = CheckpointInfo(
        sandbox_id="ate-1",
        directory="/img",
        files=["pages.img", "checkpoint.img"],
        runtime_version="runsc-2022",
        size_bytes=10,
    )
    assert info.files == ("checkpoint.img", "pages.img")
    assert info.fidelity is Fidelity.MEMORY
    with pytest.raises(InvalidArgument):
        CheckpointInfo(
            sandbox_id="x", directory="/i", files=["a/b"], runtime_version="v", size_bytes=0
        )
    stats = SandboxStats(memory_bytes=1, cpu_seconds=0.5, uptime_seconds=2.0)
    assert stats.memory_bytes == 1
