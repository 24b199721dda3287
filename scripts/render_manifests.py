"""Render a kustomization offline: the small subset of kustomize that deploy/kubernetes uses.

Usage: python scripts/render_manifests.py deploy/kubernetes/overlays/example > out.yaml

``kubectl kustomize DIR`` (or ``kubectl apply -k DIR``) is the real thing; this renderer
exists so that the manifests can be checked without kubectl (tests/deploy). It supports:

* ``resources``: YAML files (several documents each) and directories holding a
  kustomization, rendered first (bases);
* ``namespace``: set on every namespaced object; a ``Namespace`` object is renamed to it;
* ``labels`` (``pairs``, ``includeSelectors``, ``includeTemplates``) and the older
  ``commonLabels`` (= ``includeSelectors: true``): object labels, pod template labels and,
  with selectors, Service selectors, ``matchLabels`` of workloads, topology spread
  constraints and pod (anti-)affinity terms;
* ``commonAnnotations``: object and pod template annotations;
* ``images``: ``name`` → ``newName`` / ``newTag`` / ``digest`` in every ``containers`` and
  ``initContainers`` list;
* ``replicas``: ``name`` → ``count`` for Deployments, StatefulSets and ReplicaSets;
* ``patches`` / ``patchesStrategicMerge``: strategic-merge patches from a ``path`` or an
  inline ``patch``, matched by the patch's kind and name (or by a ``target`` with
  ``kind``/``name``). Maps merge; lists of containers, volumes, volume mounts, env vars,
  ports and a few others merge by their Kubernetes merge key; every other list is replaced;
  ``null`` deletes a key and ``$patch: delete`` / ``$patch: replace`` work on maps.

Anything else in a kustomization (generators, JSON 6902 patches, remote resources,
name prefixes...) is refused with an error rather than silently ignored.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import yaml

Obj = dict[str, Any]

KUSTOMIZATION_FILES: Final = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS: Final = frozenset(
    {
        "apiVersion",
        "kind",
        "resources",
        "namespace",
        "labels",
        "commonLabels",
        "commonAnnotations",
        "images",
        "replicas",
        "patches",
        "patchesStrategicMerge",
    }
)
CLUSTER_SCOPED: Final = frozenset(
    {
        "Namespace",
        "Node",
        "PersistentVolume",
        "StorageClass",
        "PriorityClass",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "RuntimeClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "APIService",
        "IngressClass",
    }
)
WORKLOADS: Final = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"}
)
SCALABLE: Final = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"})
# kustomize's legacy output order; other kinds follow, by name.
KIND_ORDER: Final = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)
# Strategic-merge keys of the lists this renderer merges (Kubernetes' patchMergeKey).
LIST_MERGE_KEYS: Final = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "hostAliases": "ip",
}


class KustomizeError(Exception):
    """A kustomization this renderer cannot render (or an invalid one)."""


# --- loading ------------------------------------------------------------------------------


def load_documents(path: Path) -> list[Obj]:
    """Every non-empty YAML document of ``path``; each must be a Kubernetes object."""
    with path.open(encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "metadata" not in d:
            raise KustomizeError(f"{path}: every document must be an object with kind/metadata")
    return docs


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise KustomizeError(f"{directory}: no kustomization.yaml")


def load_kustomization(directory: Path) -> Obj:
    path = kustomization_file(directory)
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unsupported = sorted(set(data) - SUPPORTED_FIELDS)
    if unsupported:
        raise KustomizeError(f"{path}: fields not supported here: {', '.join(unsupported)}")
    return data


# --- the transformers ---------------------------------------------------------------------


def _key(obj: Obj) -> tuple[str, str]:
    return str(obj["kind"]), str(obj["metadata"].get("name", ""))


def pod_templates(obj: Obj) -> Iterator[Obj]:
    """The pod template(s) of a workload (``spec.template``; CronJob's job template)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if obj["kind"] in WORKLOADS and isinstance(spec.get("template"), dict):
        yield spec["template"]
    if obj["kind"] == "CronJob":
        job = spec.get("jobTemplate", {}).get("spec", {})
        if isinstance(job.get("template"), dict):
            yield job["template"]


def set_namespace(objects: list[Obj], namespace: str) -> None:
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] == "Namespace":
            meta["name"] = namespace
        elif obj["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = namespace


def _add(target: Obj, field: str, pairs: dict[str, str]) -> None:
    current = target.get(field) or {}
    current.update(pairs)
    target[field] = current


def _selector_maps(obj: Obj) -> Iterator[tuple[Obj, str]]:
    """(parent, field) of every label selector map that commonLabels extends."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if obj["kind"] == "Service":
        yield spec, "selector"
        return
    if obj["kind"] in WORKLOADS and obj["kind"] != "Job":
        if obj["kind"] == "ReplicationController":
            yield spec, "selector"
        else:
            yield spec.setdefault("selector", {}), "matchLabels"
    for template in pod_templates(obj):
        pod = template.get("spec") or {}
        for constraint in pod.get("topologySpreadConstraints") or []:
            if isinstance(constraint.get("labelSelector"), dict):
                yield constraint["labelSelector"], "matchLabels"
        affinity = pod.get("affinity") or {}
        for kind in ("podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind) or {}
            for term in terms.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
                if isinstance(term.get("labelSelector"), dict):
                    yield term["labelSelector"], "matchLabels"
            for weighted in terms.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
                term = weighted.get("podAffinityTerm") or {}
                if isinstance(term.get("labelSelector"), dict):
                    yield term["labelSelector"], "matchLabels"


def add_labels(
    objects: list[Obj], pairs: dict[str, str], *, selectors: bool, templates: bool
) -> None:
    for obj in objects:
        _add(obj["metadata"], "labels", pairs)
        if selectors or templates:
            for template in pod_templates(obj):
                _add(template.setdefault("metadata", {}), "labels", pairs)
        if selectors:
            for parent, field in _selector_maps(obj):
                _add(parent, field, pairs)


def add_annotations(objects: list[Obj], pairs: dict[str, str]) -> None:
    for obj in objects:
        _add(obj["metadata"], "annotations", pairs)
        for template in pod_templates(obj):
            _add(template.setdefault("metadata", {}), "annotations", pairs)


def split_image(image: str) -> tuple[str, str, str]:
    """``registry:5000/a/b:tag@sha256:...`` → (name, tag, digest); tag/digest may be ''."""
    rest, _, digest = image.partition("@")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        return rest[:colon], rest[colon + 1 :], digest
    return rest, "", digest


def _containers(node: Any) -> Iterator[Obj]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def set_images(objects: list[Obj], images: list[Obj]) -> None:
    for spec in images:
        if "name" not in spec:
            raise KustomizeError(f"images entry without a name: {spec}")
        for obj in objects:
            for container in _containers(obj):
                image = container.get("image")
                if not isinstance(image, str):
                    continue
                name, tag, digest = split_image(image)
                if name != spec["name"]:
                    continue
                name = str(spec.get("newName", name))
                if "digest" in spec:
                    container["image"] = f"{name}@{spec['digest']}"
                    continue
                tag = str(spec.get("newTag", tag))
                image = f"{name}:{tag}" if tag else name
                container["image"] = f"{image}@{digest}" if digest else image


def set_replicas(objects: list[Obj], replicas: list[Obj]) -> None:
    for spec in replicas:
        matched = [o for o in objects if o["kind"] in SCALABLE and _key(o)[1] == spec["name"]]
        if not matched:
            raise KustomizeError(f"replicas: no workload named {spec['name']!r}")
        for obj in matched:
            obj.setdefault("spec", {})["replicas"] = int(spec["count"])


# --- strategic merge ----------------------------------------------------------------------


def _list_merge_key(field: str, items: list[Any]) -> str | None:
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    if field == "ports":
        if all("containerPort" in i for i in items):
            return "containerPort"
        if all("port" in i for i in items):
            return "port"
        return None
    key = LIST_MERGE_KEYS.get(field)
    if key is not None and all(key in i for i in items):
        return key
    return None


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """``patch`` applied to ``base`` (both left untouched) with the rules in the docstring."""
    if isinstance(patch, dict) and isinstance(base, dict):
        directive = patch.get("$patch")
        if directive == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if directive is not None:
            raise KustomizeError(f"unsupported $patch directive {directive!r} at {field!r}")
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if key.startswith("$"):
                raise KustomizeError(f"unsupported patch directive {key!r}")
            if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(patch, list) and isinstance(base, list):
        merge_key = _list_merge_key(field, patch)
        if merge_key is None or _list_merge_key(field, base) != merge_key:
            return copy.deepcopy(patch)
        merged = copy.deepcopy(base)
        for item in patch:
            position = next(
                (i for i, b in enumerate(merged) if b[merge_key] == item[merge_key]), None
            )
            if item.get("$patch") == "delete":
                if position is not None:
                    del merged[position]
            elif position is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[position] = strategic_merge(merged[position], item, field)
        return merged
    return copy.deepcopy(patch)


def apply_patches(objects: list[Obj], entries: Iterable[Any], directory: Path) -> list[Obj]:
    for entry in entries:
        target: Obj = {}
        if isinstance(entry, str):  # patchesStrategicMerge: a path
            text = (directory / entry).read_text(encoding="utf-8")
        elif isinstance(entry, dict) and "path" in entry:
            text = (directory / entry["path"]).read_text(encoding="utf-8")
            target = entry.get("target") or {}
        elif isinstance(entry, dict) and "patch" in entry:
            text = str(entry["patch"])
            target = entry.get("target") or {}
        else:
            raise KustomizeError(f"unsupported patch entry: {entry!r}")
        unknown = sorted(set(target) - {"kind", "name"})
        if unknown:
            raise KustomizeError(f"patch target fields not supported: {', '.join(unknown)}")
        for patch in (d for d in yaml.safe_load_all(text) if d is not None):
            if not isinstance(patch, dict):
                raise KustomizeError(f"{entry!r}: JSON 6902 patches are not supported")
            kind = target.get("kind", patch.get("kind"))
            name = target.get("name", patch.get("metadata", {}).get("name"))
            hits = [i for i, o in enumerate(objects) if _key(o) == (kind, name)]
            if not hits:
                raise KustomizeError(f"patch {entry!r}: no {kind} named {name!r}")
            body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}
            if target:
                body.get("metadata", {}).pop("name", None)
            for i in hits:
                objects[i] = strategic_merge(objects[i], body)
    return objects


# --- rendering ----------------------------------------------------------------------------


def render(directory: Path | str) -> list[Obj]:
    """The objects the kustomization in ``directory`` builds, in kustomize's legacy order."""
    directory = Path(directory)
    k = load_kustomization(directory)
    objects: list[Obj] = []
    for entry in k.get("resources") or []:
        if "://" in str(entry) or str(entry).startswith("github.com/"):
            raise KustomizeError(f"{directory}: remote resources are not supported: {entry}")
        path = directory / entry
        objects += render(path) if path.is_dir() else load_documents(path)
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        ident = (*_key(obj), str(obj["metadata"].get("namespace", "")))
        if ident in seen:
            raise KustomizeError(f"{directory}: {ident[0]} {ident[1]!r} is defined twice")
        seen.add(ident)
    steps: list[tuple[str, Callable[[], object]]] = [
        (
            "patches",
            lambda: apply_patches(
                objects,
                [*(k.get("patchesStrategicMerge") or []), *(k.get("patches") or [])],
                directory,
            ),
        ),
        ("namespace", lambda: set_namespace(objects, k["namespace"])),
        (
            "commonLabels",
            lambda: add_labels(objects, k["commonLabels"], selectors=True, templates=True),
        ),
        ("labels", lambda: _labels(objects, k["labels"])),
        ("commonAnnotations", lambda: add_annotations(objects, k["commonAnnotations"])),
        ("images", lambda: set_images(objects, k["images"])),
        ("replicas", lambda: set_replicas(objects, k["replicas"])),
    ]
    for field, step in steps:
        if field == "patches" or k.get(field):
            step()
    return sort_objects(objects)


def _labels(objects: list[Obj], entries: list[Obj]) -> None:
    for entry in entries:
        unknown = sorted(set(entry) - {"pairs", "includeSelectors", "includeTemplates"})
        if unknown:
            raise KustomizeError(f"labels fields not supported: {', '.join(unknown)}")
        add_labels(
            objects,
            dict(entry.get("pairs") or {}),
            selectors=bool(entry.get("includeSelectors", False)),
            templates=bool(entry.get("includeTemplates", False)),
        )


def sort_objects(objects: list[Obj]) -> list[Obj]:
    def order(obj: Obj) -> tuple[int, str, str, str]:
        kind, name = _key(obj)
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return rank, kind, str(obj["metadata"].get("namespace", "")), name

    return sorted(objects, key=order)


def dump(objects: list[Obj]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=True, default_flow_style=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("directory", type=Path, help="a directory with a kustomization.yaml")
    args = p.parse_args(argv)
    try:
        print(dump(render(args.directory)), end="")
    except KustomizeError as exc:
        print(f"render_manifests: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
