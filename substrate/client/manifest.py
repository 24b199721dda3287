"""Template files (YAML or JSON) and plain-data views of the model's records.

A template file describes one :class:`~substrate.core.model.ActorTemplate`:

.. code-block:: yaml

    kind: ActorTemplate          # optional
    name: counter
    atespace: demo               # optional: ``ate create template -a`` or the caller says
    sandboxClass: gvisor         # gvisor | microvm | fake
    resources: {cpu: 100m, memory: 64Mi}
    containers:
      - name: app
        image: counter:1
        ports: [80]
        env: {STATE_DIR: /tmp/state}      # or a list of {name, value}
        command: []                        # default: the image's entrypoint
        wakeupProbe: {path: /readyz, port: 80, timeoutSeconds: 30}
    snapshot: {fidelity: memory, storageLocation: ""}   # "" = the control plane's default
    workerSelector: {}
    goldenSnapshot: false

Keys may also be written in snake_case; unknown keys are refused. Failures are
:class:`~substrate.errors.InvalidArgument` naming the offending field.

:func:`to_data` turns records (atespaces, templates, actors, tags, workers, resume results)
into JSON-ready dicts, with templates in the same shape as the file.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from substrate.core.ids import Labels, TemplateRef
from substrate.core.model import (
    Actor,
    ActorTemplate,
    Atespace,
    Capacity,
    Container,
    EnvVar,
    Fidelity,
    Metadata,
    Probe,
    Resources,
    ResumeResult,
    SandboxClass,
    Snapshot,
    SnapshotConfig,
    Tag,
    Worker,
)
from substrate.errors import InvalidArgument, NotFound

TEMPLATE_KIND: Final = "ActorTemplate"
_BINARY: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE: Final = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)(i?)[bB]?\s*$")
_CPU_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m?)\s*$")
_CAMEL_RE: Final = re.compile(r"_([a-z])")


def _camel(key: str) -> str:
    return _CAMEL_RE.sub(lambda m: m.group(1).upper(), key)


def _fields(data: object, where: str, allowed: set[str]) -> dict[str, Any]:
    """``data`` as a dict with camelCase keys; unknown keys refused."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"{where} must be a mapping")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise InvalidArgument(f"{where}: key {key!r} is not a string")
        name = _camel(key)
        if name not in allowed:
            raise InvalidArgument(
                f"{where}: unknown field {key!r} (known: {', '.join(sorted(allowed))})"
            )
        out[name] = value
    return out


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{where} must be a string")
    return value


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{where} must be an integer")
    return value


def parse_cpu(value: object) -> int:
    """``100m``, ``0.5``, ``2`` (cores) → milli-CPUs."""
    if isinstance(value, bool):
        raise InvalidArgument(f"cpu {value!r} is invalid")
    if isinstance(value, int | float):
        return round(float(value) * 1000)
    match = _CPU_RE.match(str(value))
    if match is None:
        raise InvalidArgument(f"cpu {value!r} is invalid: want e.g. 100m or 0.5")
    number = float(match.group(1))
    return round(number if match.group(2) else number * 1000)


def parse_memory(value: object) -> int:
    """``64Mi``, ``1Gi``, ``512M`` (binary units), or bytes → bytes."""
    if isinstance(value, bool):
        raise InvalidArgument(f"memory {value!r} is invalid")
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(str(value))
    if match is None:
        raise InvalidArgument(f"memory {value!r} is invalid: want e.g. 64Mi or 1Gi")
    return int(match.group(1)) * _BINARY[match.group(2).lower()]


def format_memory(value: int) -> str:
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _enum_value(cls: type[enum.Enum], value: object, where: str) -> Any:
    text = _str(value, where).strip().upper().replace("-", "_")
    try:
        return cls[text]
    except KeyError:
        names = ", ".join(m.name.lower() for m in cls)
        raise InvalidArgument(f"{where} {value!r} is invalid (one of: {names})") from None


def _probe(data: object, where: str) -> Probe | None:
    if data is None:
        return None
    f = _fields(data, where, {"path", "port", "timeoutSeconds"})
    return Probe(
        path=_str(f.get("path", "/"), f"{where}.path"),
        port=_int(f.get("port", 80), f"{where}.port"),
        timeout_seconds=_int(f.get("timeoutSeconds", 30), f"{where}.timeoutSeconds"),
    )


def _env(data: object, where: str) -> tuple[EnvVar, ...]:
    if data is None:
        return ()
    if isinstance(data, Mapping):
        return tuple(EnvVar(name=_str(k, f"{where} name"), value=str(v)) for k, v in data.items())
    if isinstance(data, list):
        out = []
        for i, item in enumerate(data):
            f = _fields(item, f"{where}[{i}]", {"name", "value"})
            out.append(
                EnvVar(
                    name=_str(f.get("name"), f"{where}[{i}].name"),
                    value=str(f.get("value", "")),
                )
            )
        return tuple(out)
    raise InvalidArgument(f"{where} must be a mapping or a list of {{name, value}}")


def _container(data: object, where: str) -> Container:
    f = _fields(data, where, {"name", "image", "command", "env", "ports", "wakeupProbe"})
    command = f.get("command") or []
    ports = f.get("ports", [80])
    if not isinstance(command, list):
        raise InvalidArgument(f"{where}.command must be a list of strings")
    if not isinstance(ports, list):
        raise InvalidArgument(f"{where}.ports must be a list of integers")
    return Container(
        name=_str(f.get("name"), f"{where}.name"),
        image=_str(f.get("image"), f"{where}.image"),
        command=tuple(_str(c, f"{where}.command[]") for c in command),
        env=_env(f.get("env"), f"{where}.env"),
        ports=tuple(_int(p, f"{where}.ports[]") for p in ports),
        wakeup_probe=_probe(f.get("wakeupProbe"), f"{where}.wakeupProbe"),
    )


def _labels(data: object, where: str) -> Labels:
    if data is None:
        return Labels()
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"{where} must be a mapping of strings")
    return Labels({_str(k, where): str(v) for k, v in data.items()})


def template_from_data(data: object, *, atespace: str | None = None) -> ActorTemplate:
    """The template a decoded file describes; ``atespace`` fills in (or must match) the file's."""
    f = _fields(
        data,
        "template",
        {
            "kind",
            "apiVersion",
            "name",
            "atespace",
            "containers",
            "resources",
            "workerSelector",
            "sandboxClass",
            "snapshot",
            "goldenSnapshot",
            # written by the server; read back (``ate get template -o yaml``) and ignored
            "metadata",
            "goldenTag",
            "goldenError",
        },
    )
    kind = f.get("kind", TEMPLATE_KIND)
    if kind != TEMPLATE_KIND:
        raise InvalidArgument(f"template: kind {kind!r} is not {TEMPLATE_KIND}")
    name = _str(f.get("name"), "template.name")
    space = f.get("atespace")
    if space is not None and atespace is not None and space != atespace:
        raise InvalidArgument(
            f"the template file names atespace {space!r}, the command {atespace!r}"
        )
    space = space if space is not None else atespace
    if space is None:
        raise InvalidArgument("the template names no atespace (set 'atespace:' or pass one)")
    containers = f.get("containers")
    if not isinstance(containers, list) or not containers:
        raise InvalidArgument("template.containers must be a non-empty list")
    res = _fields(f.get("resources"), "template.resources", {"cpu", "memory"})
    snap = _fields(f.get("snapshot"), "template.snapshot", {"fidelity", "storageLocation"})
    golden = f.get("goldenSnapshot", False)
    if not isinstance(golden, bool):
        raise InvalidArgument("template.goldenSnapshot must be true or false")
    template = ActorTemplate(
        ref=TemplateRef(atespace=_str(space, "template.atespace"), name=name),
        containers=tuple(
            _container(c, f"template.containers[{i}]") for i, c in enumerate(containers)
        ),
        resources=Resources(
            cpu_milli=parse_cpu(res.get("cpu", 0)), memory_bytes=parse_memory(res.get("memory", 0))
        ),
        worker_selector=_labels(f.get("workerSelector"), "template.workerSelector"),
        sandbox_class=_enum_value(
            SandboxClass, f.get("sandboxClass", "gvisor"), "template.sandboxClass"
        ),
        snapshot_config=SnapshotConfig(
            preferred_fidelity=_enum_value(
                Fidelity, snap.get("fidelity", "memory"), "template.snapshot.fidelity"
            ),
            storage_location=_str(
                snap.get("storageLocation", ""), "template.snapshot.storageLocation"
            ),
        ),
        golden_snapshot=golden,
    )
    return template.validate()


def parse_template(text: str, *, source: str = "", atespace: str | None = None) -> ActorTemplate:
    """A template from YAML or JSON text (JSON is YAML); ``source`` names it in errors."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidArgument(
            f"{source or 'the template'} is not valid YAML or JSON: {exc}"
        ) from None
    try:
        return template_from_data(data, atespace=atespace)
    except InvalidArgument as exc:
        if not source:
            raise
        raise InvalidArgument(f"{source}: {exc.description}") from None


def load_template(path: str | os.PathLike[str], *, atespace: str | None = None) -> ActorTemplate:
    """The template in the YAML or JSON file ``path``."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise NotFound(f"template file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read template file {p}: {exc}") from None
    return parse_template(text, source=str(p), atespace=atespace)


# --- records as plain data ------------------------------------------------------------------


def _metadata(m: Metadata) -> dict[str, Any]:
    return {
        "uid": m.uid,
        "version": m.version,
        "createTime": m.create_time,
        "updateTime": m.update_time,
    }


def template_to_data(t: ActorTemplate) -> dict[str, Any]:
    """``t`` in the template file's shape (plus its metadata and golden-snapshot status)."""
    out: dict[str, Any] = {
        "kind": TEMPLATE_KIND,
        "name": t.ref.name,
        "atespace": t.ref.atespace,
        "sandboxClass": t.sandbox_class.name.lower(),
        "resources": {
            "cpu": f"{t.resources.cpu_milli}m",
            "memory": format_memory(t.resources.memory_bytes),
        },
        "containers": [
            {
                "name": c.name,
                "image": c.image,
                "ports": list(c.ports),
                **({"command": list(c.command)} if c.command else {}),
                **({"env": {e.name: e.value for e in c.env}} if c.env else {}),
                **(
                    {
                        "wakeupProbe": {
                            "path": c.wakeup_probe.path,
                            "port": c.wakeup_probe.port,
                            "timeoutSeconds": c.wakeup_probe.timeout_seconds,
                        }
                    }
                    if c.wakeup_probe is not None
                    else {}
                ),
            }
            for c in t.containers
        ],
        "snapshot": {
            "fidelity": t.snapshot_config.preferred_fidelity.name.lower(),
            "storageLocation": t.snapshot_config.storage_location,
        },
        "workerSelector": t.worker_selector.as_dict(),
        "goldenSnapshot": t.golden_snapshot,
    }
    if t.golden_tag is not None:
        out["goldenTag"] = str(t.golden_tag)
    if t.golden_error:
        out["goldenError"] = t.golden_error
    out["metadata"] = _metadata(t.metadata)
    return out


def _snapshot(s: Snapshot) -> dict[str, Any]:
    return {
        "generation": s.generation,
        "snapshotId": s.snapshot_id,
        "owner": s.owner.name.lower(),
        "sandboxClass": s.sandbox_class.name.lower(),
        "runtimeVersion": s.runtime_version,
        "capturedAt": s.captured_at,
        **({"sourceTag": str(s.source_tag)} if s.source_tag is not None else {}),
        "storages": [
            {
                "durability": x.durability.name.lower(),
                "status": x.status.name.lower(),
                "fidelity": x.fidelity.name.lower(),
                **({"uri": x.uri} if x.uri else {}),
                **({"node": x.node.name} if x.node is not None else {}),
            }
            for x in s.storages
        ],
    }


def _capacity(c: Capacity | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"cpu": f"{c.cpu_milli}m", "memory": format_memory(c.memory_bytes), "actors": c.actors}


def to_data(record: object) -> Any:
    """A JSON-ready view of a model record (or a list of them)."""
    if isinstance(record, list | tuple):
        return [to_data(r) for r in record]
    if isinstance(record, Atespace):
        return {"name": record.name, "metadata": _metadata(record.metadata)}
    if isinstance(record, ActorTemplate):
        return template_to_data(record)
    if isinstance(record, Actor):
        st = record.status
        a = st.assignment
        return {
            "atespace": record.ref.atespace,
            "name": record.ref.name,
            "template": str(record.template),
            **({"sourceTag": str(record.source_tag)} if record.source_tag else {}),
            "workerSelector": record.worker_selector.as_dict(),
            "state": record.state.name,
            "worker": a.worker.name if a is not None else None,
            "node": a.node.name if a is not None else None,
            **({"crash": st.crash.message} if st.crash is not None else {}),
            "snapshots": [_snapshot(s) for s in st.snapshots],
            "metadata": _metadata(record.metadata),
        }
    if isinstance(record, Tag):
        return {
            "atespace": record.ref.atespace,
            "name": record.ref.name,
            "sourceActor": str(record.source_actor) if record.source_actor else None,
            "template": str(record.template) if record.template else None,
            "snapshot": _snapshot(record.snapshot) if record.snapshot is not None else None,
            "metadata": _metadata(record.metadata),
        }
    if isinstance(record, Worker):
        return {
            "name": record.ref.name,
            "node": record.node.name,
            "pool": record.pool,
            "state": record.state.name,
            "sandboxClass": record.sandbox_class.name.lower(),
            "epoch": record.epoch,
            "labels": record.labels.as_dict(),
            "capacity": _capacity(record.capacity),
            "allocated": _capacity(record.allocated),
            "tunnelAddress": record.tunnel_address,
            "lastHeartbeat": record.last_heartbeat,
        }
    if isinstance(record, ResumeResult):
        return {
            "actor": to_data(record.actor),
            "resumed": record.resumed,
            "source": record.provenance if record.resumed else None,
            "generation": record.generation,
            "snapshotAgeSeconds": record.snapshot_age_seconds,
            "resumeDurationSeconds": record.resume_duration_seconds,
        }
    raise InvalidArgument(f"cannot render {type(record).__name__}")


__all__ = [
    "TEMPLATE_KIND",
    "format_memory",
    "load_template",
    "parse_cpu",
    "parse_memory",
    "parse_template",
    "template_from_data",
    "template_to_data",
    "to_data",
]
