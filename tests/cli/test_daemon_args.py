"""The daemons' argv builders emit only flags the daemons parse, with the values given."""

from __future__ import annotations

from pathlib import Path

from daemons.ateapi import settings as ateapi_settings
from daemons.atelet import settings as atelet_settings
from daemons.ateworker import settings as worker_settings
from daemons.router import settings as router_settings
from substrate.cli.daemon_args import ateapi_argv, atelet_argv, router_argv, worker_argv


def test_every_setting_reaches_the_daemon(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    argv = ateapi_argv(
        listen="127.0.0.1:1001",
        admin_listen="127.0.0.1:1002",
        tls_dir=tls,
        trust_domain="ate",
        store="postgresql://u@h/db",
        objects="s3://b/p",
        heartbeat_timeout=10,
        reconcile_every=0.5,
    )
    assert argv[0] == "daemons.ateapi"
    api = ateapi_settings.parse(argv[1:])
    assert (api.listen, api.admin_listen, api.tls_dir, api.trust_domain) == (
        ("127.0.0.1", 1001),
        ("127.0.0.1", 1002),
        tls,
        "ate",
    )
    assert (api.store, api.objects, api.heartbeat_timeout, api.reconcile_every) == (
        "postgresql://u@h/db",
        "s3://b/p",
        10.0,
        0.5,
    )

    argv = atelet_argv(
        node="n1",
        node_dir=tmp_path / "n1",
        images=tmp_path / "images",
        listen="127.0.0.1:0",
        ateapi="127.0.0.1:1001",
        tls_dir=tls,
        trust_domain="ate",
        objects=["s3://b/p", "", "file:///x"],
        heartbeat_every=1,
        tag_cache_max_bytes=20 << 30,
    )
    assert argv[0] == "daemons.atelet"
    let = atelet_settings.parse(argv[1:])
    assert (let.node, let.node_dir, let.images, let.ateapi, let.tls_dir) == (
        "n1",
        tmp_path / "n1",
        tmp_path / "images",
        "127.0.0.1:1001",
        tls,
    )
    assert (let.objects, let.heartbeat_every, let.trust_domain, let.tag_cache_max_bytes) == (
        ("s3://b/p", "file:///x"),
        1.0,
        "ate",
        20 << 30,
    )

    argv = worker_argv(
        name="w1",
        node="n1",
        node_dir=str(tmp_path / "n1"),
        runtime="fake",
        tunnel_listen="127.0.0.1:1003",
        tls_dir=tls,
        trust_domain="ate",
        max_actors=3,
        memory="2Gi",
        probe_timeout=3.0,
        labels={"slot": "a", "node": "n1"},
    )
    assert argv[0] == "daemons.ateworker"
    w = worker_settings.parse(argv[1:])
    assert (w.name, w.node, w.node_dir, w.runtime, w.tunnel_listen) == (
        "w1",
        "n1",
        tmp_path / "n1",
        "fake",
        ("127.0.0.1", 1003),
    )
    assert (w.capacity.actors, w.capacity.memory_bytes, w.probe_timeout, w.labels) == (
        3,
        2 << 30,
        3.0,
        (("slot", "a"), ("node", "n1")),
    )

    argv = router_argv(
        listen="127.0.0.1:1004",
        admin_listen="127.0.0.1:1005",
        ateapi_address="127.0.0.1:1001",
        tls_dir=tls,
        trust_domain="ate",
        parked_request_budget=1.5,
        parked_request_max=7,
    )
    assert argv[0] == "daemons.router"
    r = router_settings.parse(argv[1:])
    assert (r.listen, r.admin_listen, r.ateapi_address, r.tls_dir, r.trust_domain) == (
        ("127.0.0.1", 1004),
        ("127.0.0.1", 1005),
        "127.0.0.1:1001",
        tls,
        "ate",
    )
    assert (r.router.parking.budget, r.router.parking.max_parked) == (1.5, 7)


def test_unset_settings_are_left_to_the_daemon(tmp_path: Path) -> None:
    assert ateapi_argv(tls_dir=tmp_path) == ["daemons.ateapi", f"--tls-dir={tmp_path}"]
    assert atelet_argv(node="n", node_dir="/d", ateapi="h:1", tls_dir="/t") == [
        "daemons.atelet",
        "--node=n",
        "--node-dir=/d",
        "--ateapi=h:1",
        "--tls-dir=/t",
    ]
    assert worker_argv(name="w", node="n", node_dir="/d", tls_dir="/t") == [
        "daemons.ateworker",
        "--name=w",
        "--node=n",
        "--node-dir=/d",
        "--tls-dir=/t",
    ]
    assert router_argv(tls_dir="/t") == ["daemons.router", "--tls-dir=/t"]


def test_numbers_are_written_exactly() -> None:
    argv = ateapi_argv(tls_dir="/t", heartbeat_timeout=10.0, reconcile_every=0.1)
    assert argv[-2:] == ["--heartbeat-timeout=10", "--reconcile-every=0.1"]
    assert router_argv(tls_dir="/t", parked_request_budget=5.0)[-1] == (
        "--parked-request-budget=5s"
    )
