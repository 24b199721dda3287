"""substrate.api.pb re-exports exactly the public generated types."""

from __future__ import annotations

import inspect

from substrate.api import pb
from substrate.api._gen.substrate import v1


def test_pb_exports_every_generated_type() -> None:
    generated = {
        name
        for name, obj in vars(v1).items()
        if inspect.isclass(obj) and obj.__module__ == v1.__name__
    }
    missing = sorted(generated - set(pb.__all__))
    extra = sorted(set(pb.__all__) - generated)
    assert not missing, f"add these to substrate/api/pb.py: {missing}"
    assert not extra, f"remove these from substrate/api/pb.py: {extra}"
    for name in pb.__all__:
        assert getattr(pb, name) is getattr(v1, name)


def test_every_service_has_a_stub_and_a_base() -> None:
    for service in ("Control", "WorkerRegistry", "Atelet", "Ateworker"):
        assert hasattr(pb, f"{service}Stub")
        assert hasattr(pb, f"{service}Base")


RPCS = {
    "Control": (
        "CreateAtespace GetAtespace ListAtespaces DeleteAtespace "
        "CreateActorTemplate GetActorTemplate ListActorTemplates UpdateActorTemplate "
        "DeleteActorTemplate "
        "CreateActor GetActor ListActors UpdateActor SuspendActor PauseActor ResumeActor "
        "RevertActor DeleteActor "
        "CreateTag GetTag ListTags DeleteTag "
        "ListWorkers GetWorker DrainWorker"
    ),
    "WorkerRegistry": "RegisterWorker Heartbeat RequestActorSuspend",
    "Atelet": "Run Restore Checkpoint UploadSnapshot Terminate Detach DropSnapshot",
    "Ateworker": (
        "RunWorkload RestoreWorkload CheckpointWorkload TerminateWorkload GetWorkloadStats "
        "GetWorkerInfo"
    ),
}


def test_rpc_paths() -> None:
    """The method paths both sides agree on (a rename here breaks every deployed peer)."""

    class Control(pb.ControlBase):
        pass

    class Registry(pb.WorkerRegistryBase):
        pass

    class Atelet(pb.AteletBase):
        pass

    class Ateworker(pb.AteworkerBase):
        pass

    paths: set[str] = set()
    for servicer in (Control(), Registry(), Atelet(), Ateworker()):
        paths |= set(servicer.__mapping__())
    expected = {
        f"/substrate.v1.{service}/{rpc}" for service, rpcs in RPCS.items() for rpc in rpcs.split()
    }
    assert paths == expected
