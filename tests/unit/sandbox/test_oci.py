"""The OCI config.json of a sandbox: golden output (docs/gvisor-notes.md §1b)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from substrate.core.model import EnvVar, Probe, Resources
from substrate.sandbox.oci import build_config, network_namespace_path, process_env, render_config
from substrate.sandbox.spec import SandboxSpec

CAPS = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]


def spec(**changes: Any) -> SandboxSpec:
    fields: dict[str, Any] = {
        "sandbox_id": "ate-0f3c",
        "bundle_dir": "/var/lib/ate/bundles/ate-0f3c",
        "netns_path": "/var/run/netns/gvn-0f3c",
        "args": ("/bin/sh", "-c", "exec httpd -f -p 0.0.0.0:80 -h /tmp/www"),
        "env": (EnvVar(name="MODE", value="prod"),),
        "ports": (80,),
        "wakeup_probe": Probe(path="/readyz", port=80),
        "resources": Resources(cpu_milli=500, memory_bytes=1 << 30),
        "address": "169.254.17.2",
        "device": "gvh0f3c",
    }
    fields.update(changes)
    return SandboxSpec(**fields)


GOLDEN: dict[str, Any] = {
    "ociVersion": "1.0.0",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": ["/bin/sh", "-c", "exec httpd -f -p 0.0.0.0:80 -h /tmp/www"],
        "env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "TERM=xterm",
            "MODE=prod",
        ],
        "cwd": "/",
        "capabilities": {
            "bounding": CAPS,
            "effective": CAPS,
            "inheritable": CAPS,
            "permitted": CAPS,
            "ambient": CAPS,
        },
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
    },
    "root": {"path": "rootfs", "readonly": True},
    "hostname": "runsc",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []},
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777"],
        },
    ],
    "linux": {
        "namespaces": [
            {"type": "pid"},
            {"type": "network", "path": "/var/run/netns/gvn-0f3c"},
            {"type": "ipc"},
            {"type": "uts"},
            {"type": "mount"},
        ]
    },
}


def test_config_matches_the_golden_file() -> None:
    assert build_config(spec()) == GOLDEN


def test_the_edits_of_the_notes_are_in_place() -> None:
    config = build_config(spec())
    assert config["process"]["terminal"] is False
    assert config["root"] == {"path": "rootfs", "readonly": True}
    assert "resources" not in config["linux"]
    assert "cgroupsPath" not in config["linux"]
    tmp = [m for m in config["mounts"] if m["destination"] == "/tmp"]
    assert tmp == [GOLDEN["mounts"][3]]
    nets = [n for n in config["linux"]["namespaces"] if n["type"] == "network"]
    assert nets == [{"type": "network", "path": "/var/run/netns/gvn-0f3c"}]


def test_a_restore_elsewhere_changes_only_the_namespace_path() -> None:
    here = spec()
    there = here.relocated(
        netns_path="/var/run/netns/gvn-other", bundle_dir="/var/lib/ate/bundles/copy"
    )
    a, b = build_config(here), build_config(there)
    assert network_namespace_path(b) == "/var/run/netns/gvn-other"
    b["linux"]["namespaces"][1]["path"] = "/var/run/netns/gvn-0f3c"
    assert a == b


def test_env_overrides_defaults_in_place() -> None:
    s = spec(env=(EnvVar(name="PATH", value="/bin"), EnvVar(name="A", value="x=y")))
    assert process_env(s) == ["PATH=/bin", "TERM=xterm", "A=x=y"]


def test_rootfs_and_cwd_come_from_the_spec() -> None:
    config = build_config(spec(rootfs="/srv/rootfs", cwd="/app"))
    assert config["root"] == {"path": "/srv/rootfs", "readonly": True}
    assert config["process"]["cwd"] == "/app"


def test_each_call_returns_a_fresh_dict() -> None:
    a = build_config(spec())
    a["mounts"][3]["options"].append("ro")
    a["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
    assert build_config(spec()) == GOLDEN


def test_render_is_stable_json() -> None:
    text = render_config(spec())
    assert text.endswith("}\n")
    assert json.loads(text) == GOLDEN
    assert render_config(spec()) == text


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (GOLDEN, "/var/run/netns/gvn-0f3c"),
        ({"linux": {"namespaces": [{"type": "network"}]}}, ""),
        ({"linux": {"namespaces": [{"type": "pid"}]}}, ""),
        ({"linux": {}}, ""),
        ({}, ""),
        ({"linux": {"namespaces": [{"type": "network", "path": 7}]}}, ""),
    ],
)
def test_network_namespace_path(config: dict[str, Any], expected: str) -> None:
    assert network_namespace_path(config) == expected
