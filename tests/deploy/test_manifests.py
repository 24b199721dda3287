"""deploy/kubernetes: schema-valid objects whose flags, Secrets, ports and paths agree.

The kustomizations (base and the example overlay) are rendered offline by
scripts/render_manifests.py and every object is validated against the Kubernetes JSON
schemas shipped inside the ``kubernetes-validate`` package (strict: unknown fields fail),
for the oldest and the newest Kubernetes version checked here. Then the objects are
checked against the code they run:

* every container's args parse with the daemon's own argparse parser (after the
  Kubernetes ``$(VAR)`` expansion with the container's env), and every flag is spelled out
  exactly (argparse would accept an abbreviation);
* the addresses in those flags match the container ports and the ateapi Service;
* the TLS directory of each daemon holds the files its wiring reads, from a Secret or from
  the init container that issues the per-node/per-pod certificate;
* every Secret (and key) referenced exists in overlays/example/secrets.example.yaml, and
  every key of the object-store Secret is a variable the object-store factory reads;
* Service selectors pick exactly one workload and their target ports exist;
* the workers are privileged, share atelet's hostPath at the same path, and use neither
  the host's PID nor its network namespace.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import ipaddress
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from substrate.adapters.objectstore.factory import ObjectStoreOptions, options_from_env
from substrate.net.egress_policy import EgressPolicy

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy/kubernetes"
BASE = KUBE / "base"
OVERLAY = KUBE / "overlays/example"
SECRETS = OVERLAY / "secrets.example.yaml"
DOCKERFILE = ROOT / "deploy/Dockerfile"

# The oldest Kubernetes minor version the manifests promise to work with, and the newest
# the installed schema package knows.
K8S_VERSIONS = ("1.29", ".".join(latest_version().split(".")[:2]))

SAMPLE_FIELDS = {
    "metadata.name": "worker-5d8f7c9b4-x2x7q",
    "metadata.namespace": "substrate",
    "spec.nodeName": "node-a.example.internal",
    "status.podIP": "10.244.1.17",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")

Obj = dict[str, Any]


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_manifests = _load_script("render_manifests")
issue_cert = _load_script("issue_cert")


@cache
def rendered(which: str) -> tuple[Obj, ...]:
    return tuple(render_manifests.render(BASE if which == "base" else OVERLAY))


@cache
def secret_templates() -> dict[str, dict[str, str]]:
    with SECRETS.open(encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    out: dict[str, dict[str, str]] = {}
    for doc in docs:
        assert doc["kind"] == "Secret", doc["kind"]
        out[doc["metadata"]["name"]] = {**doc.get("data", {}), **doc.get("stringData", {})}
    return out


# --- walking the objects ------------------------------------------------------------------


@attrs.frozen
class Container:
    workload: Obj
    pod: Obj
    spec: Obj
    init: bool

    @property
    def where(self) -> str:
        kind = "init container" if self.init else "container"
        return f"{self.workload['kind']} {self.workload['metadata']['name']} {kind} {self.name}"

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def mount_path_of(self, volume: str) -> list[str]:
        return [m["mountPath"] for m in self.spec.get("volumeMounts", []) if m["name"] == volume]

    def volume_at(self, path: str | Path) -> Obj:
        for mount in self.spec.get("volumeMounts", []):
            if Path(mount["mountPath"]) == Path(path):
                return volume(self.pod, mount["name"])
        raise AssertionError(f"{self.where}: nothing is mounted at {path}")

    def port(self, name: str) -> int:
        for port in self.spec.get("ports", []):
            if port.get("name") == name:
                return int(port["containerPort"])
        raise AssertionError(f"{self.where}: no container port named {name!r}")


def workloads(objects: tuple[Obj, ...]) -> list[Obj]:
    return [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


def pod_spec(workload: Obj) -> Obj:
    return dict(workload["spec"]["template"]["spec"])


def containers(objects: tuple[Obj, ...]) -> Iterator[Container]:
    for w in workloads(objects):
        pod = pod_spec(w)
        for spec in pod.get("initContainers", []):
            yield Container(w, pod, spec, True)
        for spec in pod["containers"]:
            yield Container(w, pod, spec, False)


def volume(pod: Obj, name: str) -> Obj:
    for v in pod.get("volumes", []):
        if v["name"] == name:
            return dict(v)
    raise AssertionError(f"no volume named {name!r}")


def find(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(f"no {kind} named {name!r}")


def daemon_of(c: Container) -> str:
    """``ateapi`` for ``python -m daemons.ateapi``; ``issue-cert`` for ``ate-issue-cert``."""
    command = c.spec.get("command", [])
    if command[:2] == ["python", "-m"] and command[2].startswith("daemons."):
        return str(command[2].removeprefix("daemons."))
    if command[:1] == ["ate-issue-cert"]:
        return "issue-cert"
    raise AssertionError(f"{c.where}: unknown command {command}")


# --- the Kubernetes side of args: quantities and $(VAR) expansion -------------------------

_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
}


def quantity(value: object) -> Decimal:
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    assert match is not None and match.group(2) in _SUFFIXES, f"bad quantity {value!r}"
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]


def env_values(c: Container, objects: tuple[Obj, ...]) -> dict[str, str]:
    """What the container's environment holds, with sample values for the downward API."""
    values: dict[str, str] = {}
    for source in c.spec.get("envFrom", []):
        ref = source["secretRef"]["name"]
        assert ref in secret_templates(), f"{c.where}: envFrom Secret {ref!r} has no template"
        values.update(secret_templates()[ref])
    for env in c.spec.get("env", []):
        name = env["name"]
        if "value" in env:
            values[name] = str(env["value"])
            continue
        src = env["valueFrom"]
        if "fieldRef" in src:
            values[name] = SAMPLE_FIELDS[src["fieldRef"]["fieldPath"]]
        elif "resourceFieldRef" in src:
            resource = src["resourceFieldRef"]["resource"]
            kind, _, what = resource.partition(".")
            amount = quantity(c.spec["resources"][kind][what])
            divisor = quantity(src["resourceFieldRef"].get("divisor", "1"))
            values[name] = str(math.ceil(amount / divisor))
        elif "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            data = find(objects, "ConfigMap", ref["name"]).get("data", {})
            assert ref["key"] in data, f"{c.where}: ConfigMap {ref['name']} has no {ref['key']}"
            values[name] = data[ref["key"]]
        elif "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            secret = secret_templates().get(ref["name"])
            assert secret is not None, f"{c.where}: Secret {ref['name']!r} has no template"
            if ref["key"] in secret:
                values[name] = secret[ref["key"]]
            else:
                assert ref.get("optional"), f"{c.where}: Secret {ref['name']} lacks {ref['key']}"
        else:
            raise AssertionError(f"{c.where}: env {name} has an unknown source {src}")
    return values


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command and args (``$$`` escapes)."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return VAR_REF.sub(one, text)


def argv_of(c: Container, objects: tuple[Obj, ...]) -> list[str]:
    env = env_values(c, objects)
    raw = [*c.spec.get("command", []), *c.spec.get("args", [])]
    argv = [expand(a, env) for a in raw]
    for before, after in zip(raw, argv, strict=True):
        assert "$(" not in after, f"{c.where}: {before!r} refers to an undefined variable"
    return argv[3:] if daemon_of(c) != "issue-cert" else argv[1:]


@contextmanager
def captured_parsers() -> Iterator[list[argparse.ArgumentParser]]:
    """Record every ArgumentParser whose parse_args is called (the daemons build theirs)."""
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def spy(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        seen.append(self)
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.parse_args = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    out: set[str] = set()
    for action in parser._actions:
        out.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.update(option_strings(sub))
    return out


def parse(c: Container, objects: tuple[Obj, ...]) -> Any:
    """The container's args parsed by its program's own parser (a failure fails the test)."""
    argv = argv_of(c, objects)
    parse_fn: Callable[[list[str]], Any]
    if daemon_of(c) == "issue-cert":
        parse_fn = lambda argv: issue_cert.build_parser().parse_args(argv)  # noqa: E731
    else:
        parse_fn = importlib.import_module(f"daemons.{daemon_of(c)}.settings").parse
    with captured_parsers() as parsers:
        try:
            settings = parse_fn(argv)
        except SystemExit as exc:
            raise AssertionError(f"{c.where}: its args do not parse: {argv}") from exc
    known = set().union(*(option_strings(p) for p in parsers))
    for arg in argv:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            assert flag in known, f"{c.where}: {flag} is not a flag of {daemon_of(c)}"
    return settings


def tls_file_name(daemon: str) -> str:
    """The bundle name the daemon's wiring reads from --tls-dir (``TlsFiles.in_dir``)."""
    wiring = (ROOT / "daemons" / daemon / "wiring.py").read_text(encoding="utf-8")
    names = set(re.findall(r"TlsFiles\.in_dir\([^,]+,\s*\"([a-z]+)\"\)", wiring))
    assert len(names) == 1, f"daemons/{daemon}/wiring.py: TLS file names {names}"
    return str(names.pop())


# --- schemas ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("which", ["base", "overlay"])
def test_every_object_is_valid_for_the_kubernetes_schema(which: str, version: str) -> None:
    objects = rendered(which)
    assert {o["kind"] for o in objects} >= {"Deployment", "DaemonSet", "Service", "ConfigMap"}
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise AssertionError(
                f"{obj['kind']} {obj['metadata']['name']}: {path}: {exc.message}"
            ) from None


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_secret_templates_are_valid_objects(version: str) -> None:
    with SECRETS.open(encoding="utf-8") as f:
        for doc in (d for d in yaml.safe_load_all(f) if d):
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_names_ports_and_env_follow_kubernetes_rules(which: str) -> None:
    objects = rendered(which)
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    assert len(namespaces) == 1
    for obj in objects:
        assert DNS_LABEL.match(obj["metadata"]["name"]), obj["metadata"]["name"]
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] in namespaces
    for c in containers(objects):
        names = [p["name"] for p in c.spec.get("ports", [])]
        assert len(names) == len(set(names)), f"{c.where}: duplicate port names"
        assert all(len(n) <= 15 and DNS_LABEL.match(n) for n in names), names
        envs = [e["name"] for e in c.spec.get("env", [])]
        assert len(envs) == len(set(envs)), f"{c.where}: duplicate env names"
        assert all(ENV_NAME.match(e) for e in envs), envs
        for probe_kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = c.spec.get(probe_kind, {})
            for handler in ("httpGet", "tcpSocket"):
                port = probe.get(handler, {}).get("port")
                if isinstance(port, str):
                    assert port in names, f"{c.where}: {probe_kind} uses unknown port {port}"
        declared = {v["name"] for v in c.pod.get("volumes", [])}
        for mount in c.spec.get("volumeMounts", []):
            assert mount["name"] in declared, f"{c.where}: mounts undeclared {mount['name']}"


def test_secret_templates_match_their_namespace() -> None:
    namespace = next(o for o in rendered("overlay") if o["kind"] == "Namespace")
    with SECRETS.open(encoding="utf-8") as f:
        for doc in (d for d in yaml.safe_load_all(f) if d):
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"]


# --- flags --------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_every_container_arg_is_a_flag_of_its_program(which: str) -> None:
    objects = rendered(which)
    programs = set()
    for c in containers(objects):
        parse(c, objects)
        programs.add(daemon_of(c))
    assert programs == {"ateapi", "router", "atelet", "ateworker", "issue-cert"}


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_addresses_in_flags_match_ports_and_services(which: str) -> None:
    objects = rendered(which)
    svc = find(objects, "Service", "ateapi")
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    ateapi_address = f"{svc['metadata']['name']}:{grpc['port']}"
    pod_ip = SAMPLE_FIELDS["status.podIP"]
    for c in containers(objects):
        if c.init:
            continue
        s = parse(c, objects)
        daemon = daemon_of(c)
        if daemon == "ateapi":
            assert s.listen == ("0.0.0.0", c.port("grpc"))
            assert s.admin_listen == ("0.0.0.0", c.port("admin"))
            assert grpc["targetPort"] == "grpc"
            assert s.store.startswith("postgresql://"), "the example store is PostgreSQL"
            assert s.default_storage_location == s.objects
        elif daemon == "router":
            assert s.listen == ("0.0.0.0", c.port("http"))
            assert s.admin_listen == ("0.0.0.0", c.port("admin"))
            assert s.ateapi_address == ateapi_address
            assert s.router.effective_drain_timeout + 5 < c.pod["terminationGracePeriodSeconds"]
        elif daemon == "atelet":
            assert s.listen == ("0.0.0.0", c.port("grpc"))
            assert s.advertise == f"{pod_ip}:{c.port('grpc')}"
            assert s.ateapi == ateapi_address
            assert s.node == SAMPLE_FIELDS["spec.nodeName"]
            assert s.objects and all(o.startswith("s3://") for o in s.objects)
            assert s.ips == (), "workers report their own pod IP (from --tunnel-advertise)"
        elif daemon == "ateworker":
            assert s.tunnel_listen == ("0.0.0.0", c.port("atunnel"))
            assert s.tunnel_advertise == f"{pod_ip}:{c.port('atunnel')}"
            assert s.name == SAMPLE_FIELDS["metadata.name"]
            assert s.node == SAMPLE_FIELDS["spec.nodeName"]
            assert s.runtime == "gvisor"
            EgressPolicy.parse(s.egress_allow)  # the worker's wiring parses it at start
            requests = c.spec["resources"]["requests"]
            assert s.capacity.cpu_milli == int(quantity(requests["cpu"]) * 1000)
            assert s.capacity.memory_bytes == int(quantity(requests["memory"]))
            limit = quantity(c.spec["resources"]["limits"]["memory"])
            assert limit > s.capacity.memory_bytes, "the limit leaves room for the worker"
        else:
            raise AssertionError(f"{c.where}: unexpected program {daemon}")


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_snapshot_location_is_shared_by_ateapi_and_atelet(which: str) -> None:
    objects = rendered(which)
    by_daemon = {daemon_of(c): parse(c, objects) for c in containers(objects) if not c.init}
    assert by_daemon["atelet"].objects == (by_daemon["ateapi"].objects,)
    trust = {s.trust_domain for s in by_daemon.values()}
    assert len(trust) == 1


# --- certificates -------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_each_tls_dir_holds_the_files_its_daemon_reads(which: str) -> None:
    objects = rendered(which)
    for c in containers(objects):
        if c.init:
            continue
        s = parse(c, objects)
        name = tls_file_name(daemon_of(c))
        wanted = {f"{name}.crt", f"{name}.key", "ca.crt"}
        tls = c.volume_at(s.tls_dir)
        if "secret" in tls:
            secret = tls["secret"]
            items = {i["path"]: i["key"] for i in secret["items"]}
            assert set(items) == wanted, f"{c.where}: {sorted(items)}"
            template = secret_templates()[secret["secretName"]]
            assert set(items.values()) <= set(template), f"{c.where}: keys missing"
            assert "ca.key" not in template, "a leaf Secret must not carry the CA key"
            continue
        # Issued at start by an init container into a shared in-memory volume.
        assert tls.get("emptyDir", {}).get("medium") == "Memory", f"{c.where}: {tls}"
        issuers = [
            i
            for i in containers(objects)
            if i.init and i.workload is c.workload and daemon_of(i) == "issue-cert"
        ]
        assert len(issuers) == 1, f"{c.where}: no certificate issuer"
        issuer = issuers[0]
        args = parse(issuer, objects)
        assert issuer.volume_at(args.out) == tls
        assert args.file_name == name
        assert args.trust_domain == s.trust_domain
        identity = issue_cert.identity_for(args.kind, args.name, args.trust_domain)
        if daemon_of(c) == "atelet":
            assert (identity.kind.value, identity.name) == ("atelet", s.node)
        else:
            assert (identity.kind.value, identity.name) == ("worker", s.name)
        pod_ip = SAMPLE_FIELDS["status.podIP"]
        assert [str(ipaddress.ip_address(ip)) for ip in args.ip] == [pod_ip]
        ca = issuer.volume_at(args.ca_dir)["secret"]
        assert {i["path"] for i in ca["items"]} == {"ca.crt", "ca.key"}
        assert {"ca.crt", "ca.key"} <= set(secret_templates()[ca["secretName"]])
        ca_volume = next(
            m["name"] for m in issuer.spec["volumeMounts"] if Path(m["mountPath"]) == args.ca_dir
        )
        assert not c.mount_path_of(ca_volume), f"{c.where}: the daemon must not see the CA key"


# --- Secrets and ConfigMaps ---------------------------------------------------------------


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_every_secret_reference_exists_in_the_templates(which: str) -> None:
    objects = rendered(which)
    referenced: set[str] = set()
    for c in containers(objects):
        env_values(c, objects)  # asserts every secretKeyRef/configMapKeyRef/envFrom
        for e in c.spec.get("env", []):
            if "secretKeyRef" in e.get("valueFrom", {}):
                referenced.add(e["valueFrom"]["secretKeyRef"]["name"])
        referenced.update(s["secretRef"]["name"] for s in c.spec.get("envFrom", []))
    for w in workloads(objects):
        for v in pod_spec(w).get("volumes", []):
            if "secret" in v:
                name = v["secret"]["secretName"]
                referenced.add(name)
                keys = {i["key"] for i in v["secret"].get("items", [])}
                assert keys <= set(secret_templates()[name]), f"{name}: {keys}"
    assert referenced == set(secret_templates()), "every template is used, every use templated"


def test_objectstore_secret_holds_only_variables_the_factory_reads() -> None:
    data = secret_templates()["substrate-objectstore"]
    for key, value in data.items():
        assert key.startswith("AWS_"), key
        assert options_from_env({key: value}) != ObjectStoreOptions(), f"{key} is not read"
    options = options_from_env(data)
    assert options.access_key_id and options.secret_access_key and options.region


def test_the_overlay_sets_images_replicas_and_the_bucket() -> None:
    base, overlay = rendered("base"), rendered("overlay")
    for c in containers(overlay):
        name, tag, _digest = render_manifests.split_image(c.spec["image"])
        assert "/" in name and tag, f"{c.where}: image {c.spec['image']} is not pinned"
    images = {c.spec["image"] for c in containers(base)}
    assert images == {"substrate", "substrate-worker"}
    for name in ("ateapi", "router", "worker"):
        assert find(overlay, "Deployment", name)["spec"]["replicas"] > 1
    bucket = find(overlay, "ConfigMap", "substrate-config")["data"]["snapshot-location"]
    assert bucket.startswith("s3://")
    assert bucket != find(base, "ConfigMap", "substrate-config")["data"]["snapshot-location"]


# --- Services, workers, the node directory ------------------------------------------------


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_service_selectors_match_one_workload_and_its_ports(which: str) -> None:
    objects = rendered(which)
    services = [o for o in objects if o["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} == {"ateapi", "router"}
    for svc in services:
        selector = svc["spec"]["selector"]
        hits = [
            w
            for w in workloads(objects)
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(hits) == 1, f"Service {svc['metadata']['name']} selects {len(hits)}"
        match = hits[0]["spec"]["selector"]["matchLabels"]
        assert match.items() <= hits[0]["spec"]["template"]["metadata"]["labels"].items()
        names = {p["name"] for c in pod_spec(hits[0])["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names, f"{svc['metadata']['name']}: {port}"
    for w in workloads(objects):
        match = w["spec"]["selector"]["matchLabels"]
        assert match.items() <= w["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_workers_are_privileged_and_share_atelets_node_directory(which: str) -> None:
    objects = rendered(which)
    main = {daemon_of(c): c for c in containers(objects) if not c.init}
    atelet, worker = main["atelet"], main["ateworker"]
    assert atelet.workload["kind"] == "DaemonSet"
    assert worker.workload["kind"] == "Deployment"
    assert worker.spec["securityContext"]["privileged"] is True
    assert not atelet.spec["securityContext"].get("privileged", False)
    for c in (atelet, worker):
        assert not c.pod.get("hostPID", False), f"{c.where}: hostPID is not needed"
        assert not c.pod.get("hostNetwork", False), f"{c.where}: pod IPs are used"
    a_settings, w_settings = parse(atelet, objects), parse(worker, objects)
    assert a_settings.node_dir == w_settings.node_dir
    a_volume = atelet.volume_at(a_settings.node_dir)
    w_volume = worker.volume_at(w_settings.node_dir)
    assert a_volume["hostPath"]["path"] == w_volume["hostPath"]["path"]
    assert a_volume["hostPath"]["path"] == str(a_settings.node_dir)
    assert a_settings.images.is_relative_to(a_settings.node_dir)
    # Workers go only where atelets run (same node selection).
    assert worker.pod.get("nodeSelector") == atelet.pod.get("nodeSelector")


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_pods_use_the_service_account_without_a_token(which: str) -> None:
    objects = rendered(which)
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    for w in workloads(objects):
        pod = pod_spec(w)
        assert pod["serviceAccountName"] == account["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False


# --- the image ----------------------------------------------------------------------------


def test_dockerfile_builds_both_images_the_manifests_name() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", text, flags=re.M))
    assert {"build", "substrate", "worker"} <= stages
    assert "python:3.11-slim-bookworm" in text
    worker_stage = text.split("AS worker", 1)[1]
    for package in ("runsc", "nftables", "iproute2", "busybox-static"):
        assert re.search(rf"\b{package}\b", worker_stage), package
    assert "scripts/issue_cert.py /usr/local/bin/ate-issue-cert" in text
    for c in containers(rendered("base")):
        if daemon_of(c) == "issue-cert":
            assert c.spec["command"][0] == "ate-issue-cert"
        else:
            assert c.spec["command"] == ["python", "-m", f"daemons.{daemon_of(c)}"]
