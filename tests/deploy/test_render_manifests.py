"""scripts/render_manifests.py (the kustomize subset) and scripts/issue_cert.py."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest
from cryptography import x509

from substrate.identity import Identity, TlsFiles
from substrate.identity.ca import spiffe_ids_of
from substrate.identity.files import load_ca

ROOT = Path(__file__).resolve().parents[2]


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rm = _load_script("render_manifests")
issue_cert = _load_script("issue_cert")

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      initContainers:
        - name: init
          image: registry.local:5000/tools
      containers:
        - name: app
          image: web:1.0
          args: [--a, --b]
          env:
            - {name: A, value: "1"}
            - {name: B, value: "2"}
          ports:
            - {name: http, containerPort: 80}
        - name: sidecar
          image: proxy@sha256:abc
"""
SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
    - {name: http, port: 80, targetPort: http}
"""


def write_base(tmp: Path) -> Path:
    base = tmp / "base"
    base.mkdir()
    (base / "app.yaml").write_text(DEPLOYMENT + "---\n" + SERVICE)
    (base / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: one\n")
    (base / "kustomization.yaml").write_text(
        "namespace: one\nresources:\n  - ns.yaml\n  - app.yaml\n"
    )
    return base


def test_strategic_merge_merges_named_lists_and_replaces_the_rest() -> None:
    base = {
        "containers": [
            {"name": "a", "args": ["1", "2"], "env": [{"name": "X", "value": "x"}]},
            {"name": "b", "image": "b"},
        ],
        "tolerations": [{"key": "k"}],
        "keep": {"x": 1, "gone": 2},
    }
    patch = {
        "containers": [
            {"name": "a", "args": ["3"], "env": [{"name": "Y", "value": "y"}]},
            {"name": "c", "image": "c"},
        ],
        "tolerations": [{"key": "other"}],
        "keep": {"gone": None, "y": 2},
    }
    out = rm.strategic_merge(base, patch)
    assert out["containers"] == [
        {
            "name": "a",
            "args": ["3"],
            "env": [{"name": "X", "value": "x"}, {"name": "Y", "value": "y"}],
        },
        {"name": "b", "image": "b"},
        {"name": "c", "image": "c"},
    ]
    assert out["tolerations"] == [{"key": "other"}]
    assert out["keep"] == {"x": 1, "y": 2}
    assert base["keep"] == {"x": 1, "gone": 2}, "inputs are not modified"
    assert rm.strategic_merge({"m": {"a": 1}}, {"m": {"$patch": "replace", "b": 2}}) == {
        "m": {"b": 2}
    }
    deleted = rm.strategic_merge(base, {"containers": [{"name": "b", "$patch": "delete"}]})
    assert [c["name"] for c in deleted["containers"]] == ["a"]


@pytest.mark.parametrize(
    ("image", "parts"),
    [
        ("web", ("web", "", "")),
        ("web:1.0", ("web", "1.0", "")),
        ("registry.local:5000/tools", ("registry.local:5000/tools", "", "")),
        ("registry.local:5000/tools:2@sha256:ab", ("registry.local:5000/tools", "2", "sha256:ab")),
    ],
)
def test_split_image(image: str, parts: tuple[str, str, str]) -> None:
    assert rm.split_image(image) == parts


def test_overlay_applies_namespace_labels_images_replicas_and_patches(tmp_path: Path) -> None:
    write_base(tmp_path)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "patch.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n"
        "    spec:\n      containers:\n        - name: app\n          args: [--c]\n"
    )
    (overlay / "kustomization.yaml").write_text(
        """\
resources: [../base]
namespace: two
commonLabels: {team: t}
labels:
  - pairs: {tier: front}
    includeTemplates: true
commonAnnotations: {owner: me}
images:
  - {name: web, newName: reg.example/web, newTag: "2.0"}
  - {name: registry.local:5000/tools, newTag: "9"}
  - {name: proxy, newName: reg.example/proxy}
replicas:
  - {name: web, count: 3}
patches:
  - path: patch.yaml
"""
    )
    objects = rm.render(overlay)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Namespace", "two"),
        ("Service", "web"),
        ("Deployment", "web"),
    ]
    ns, svc, dep = objects
    assert svc["metadata"]["namespace"] == dep["metadata"]["namespace"] == "two"
    assert "namespace" not in ns["metadata"]
    assert svc["spec"]["selector"] == {"app": "web", "team": "t"}
    assert dep["spec"]["selector"]["matchLabels"] == {"app": "web", "team": "t"}
    template = dep["spec"]["template"]
    assert template["metadata"]["labels"] == {"app": "web", "team": "t", "tier": "front"}
    assert template["metadata"]["annotations"] == {"owner": "me"}
    assert dep["metadata"]["labels"] == {"app": "web", "team": "t", "tier": "front"}
    pod = template["spec"]
    assert [c["image"] for c in pod["containers"]] == [
        "reg.example/web:2.0",
        "reg.example/proxy@sha256:abc",
    ]
    assert pod["initContainers"][0]["image"] == "registry.local:5000/tools:9"
    assert pod["containers"][0]["args"] == ["--c"]
    assert pod["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert dep["spec"]["replicas"] == 3


@pytest.mark.parametrize(
    ("kustomization", "message"),
    [
        ("resources: [app.yaml]\nnamePrefix: x-\n", "not supported here: namePrefix"),
        ("resources: [app.yaml]\nconfigMapGenerator: []\n", "configMapGenerator"),
        ("resources: [https://example.com/x]\n", "remote resources"),
        ("resources: [app.yaml, app.yaml]\n", "defined twice"),
        ("resources: [app.yaml]\nreplicas: [{name: nope, count: 1}]\n", "no workload"),
        ("resources: [app.yaml]\npatches: [{path: p.yaml}]\n", "JSON 6902"),
    ],
)
def test_what_it_cannot_render_is_refused(tmp_path: Path, kustomization: str, message: str) -> None:
    (tmp_path / "app.yaml").write_text(DEPLOYMENT)
    (tmp_path / "p.yaml").write_text("- {op: add, path: /x, value: 1}\n")
    (tmp_path / "kustomization.yaml").write_text(kustomization)
    with pytest.raises(rm.KustomizeError, match=message):
        rm.render(tmp_path)


def test_main_prints_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_base(tmp_path)
    assert rm.main([str(base)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("apiVersion: v1\nkind: Namespace\n")
    assert "namespace: one" in out


def test_issue_cert_writes_what_a_daemon_reads(tmp_path: Path) -> None:
    ca_dir, out = tmp_path / "ca", tmp_path / "tls"
    assert issue_cert.main(["ca", "--out", str(ca_dir), "--trust-domain", "example.test"]) == 0
    argv = ["leaf", "--ca-dir", str(ca_dir), "--out", str(out), "--trust-domain", "example.test"]
    assert issue_cert.main([*argv, "--kind", "worker", "--name", "worker-7c-x2x7q"]) == 0
    assert issue_cert.main([*argv, "--kind", "ateapi", "--dns", "ateapi.substrate.svc"]) == 0
    for name, identity in (
        ("worker", Identity.worker("worker-7c-x2x7q", "example.test")),
        ("ateapi", Identity.ateapi("example.test")),
    ):
        files = TlsFiles.in_dir(out, name)
        assert files.missing() == []
        assert files.key.stat().st_mode & 0o777 == 0o600
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        assert spiffe_ids_of(cert) == (identity.uri,)
        assert cert.not_valid_after_utc > datetime.now(UTC)
    assert load_ca(ca_dir).trust_domain == "example.test"
    assert issue_cert.main([*argv, "--kind", "atelet", "--name", "Not_A_Node"]) == 1
