"""The ``ate`` CLI: every command's success and failure output and exit status.

One local stack with the fake runtime (1 node, 2 workers, real processes) serves the
module; commands run in-process through :func:`substrate.cli.main.main` with captured
output. Parsing, templates and rendering are tested without a stack.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

import pytest
import yaml

from substrate.adapters.gvisor import procfs
from substrate.cli.main import main
from substrate.cli.stack import choose_runtime, free_port
from substrate.client import read_local_stack
from substrate.client.local import default_state_dir
from substrate.client.manifest import parse_template, template_to_data
from substrate.core.model import SandboxClass
from substrate.errors import FailedPrecondition, InvalidArgument

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "counter" / "template.yaml"


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"Run(code={self.code}, out={self.out!r}, err={self.err!r})"


def ate(*argv: str, state_dir: Path | None = None, env: dict[str, str] | None = None) -> Run:
    out, err = io.StringIO(), io.StringIO()
    args = list(argv) + ([f"--state-dir={state_dir}"] if state_dir is not None else [])
    code = main(args, environ={**os.environ, **(env or {})}, stdout=out, stderr=err)
    return Run(code, out.getvalue(), err.getvalue())


def error_line(run: Run) -> str:
    lines = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, run
    return lines[0]


# --- without a stack ---------------------------------------------------------------------------

COMMANDS = [
    ["up"],
    ["down"],
    ["status"],
    ["create", "atespace"],
    ["create", "template"],
    ["create", "actor"],
    ["create", "tag"],
    ["get", "atespaces"],
    ["get", "templates"],
    ["get", "actors"],
    ["get", "tags"],
    ["get", "workers"],
    ["suspend", "actor"],
    ["pause", "actor"],
    ["resume", "actor"],
    ["revert", "actor"],
    ["delete", "actor"],
    ["delete", "tag"],
    ["delete", "template"],
    ["delete", "atespace"],
    ["drain", "worker"],
    ["call"],
    ["proxy"],
    ["top"],
]


@pytest.mark.parametrize("argv", [[], *COMMANDS], ids=lambda a: " ".join(a) or "ate")
def test_help_everywhere(argv: list[str]) -> None:
    run = ate(*argv, "--help")
    assert run.code == 0, run
    out = run.out
    assert out.startswith("usage: ate")
    assert "--state-dir" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["create", "actor", "a1", "-a", "x"], "one of the arguments --template --tag"),
        (["create", "actor", "a1", "--template", "t"], "-a/--atespace"),
        (["up", "--nodes", "0"], "'0' must be at least 1"),
        (["up", "--runtime", "kvm"], "invalid choice: 'kvm'"),
        (["get", "actors", "-o", "xml"], "invalid choice: 'xml'"),
        (["proxy", "lab/a", "--port", "70000"], "must be in 1..65535"),
        (["suspend", "actor", "a", "-a", "b", "--mode", "later"], "invalid choice: 'later'"),
    ],
)
def test_usage_errors_are_one_line_with_status_2(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    run = ate(*argv, state_dir=tmp_path)
    assert run.code == 2, run
    line = error_line(run)
    assert line.startswith("error: INVALID_ARGUMENT: "), line
    assert message in line


def test_no_stack_is_a_not_found_error(tmp_path: Path) -> None:
    for argv in (["status"], ["get", "actors"], ["call", "lab/a"], ["create", "atespace", "x"]):
        run = ate(*argv, state_dir=tmp_path / "none")
        assert run.code == 1, run
        assert error_line(run) == (
            f"error: NOT_FOUND: no local stack in {tmp_path / 'none'} (start one with `ate up`)"
        )
    run = ate("down", state_dir=tmp_path / "none")
    assert run.code == 0, run
    assert "nothing to stop" in run.out


def test_state_dir_from_the_environment(tmp_path: Path) -> None:
    assert default_state_dir({"ATE_STATE_DIR": str(tmp_path / "a")}) == tmp_path / "a"
    assert default_state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "ate"
    assert default_state_dir({"HOME": str(tmp_path)}) == tmp_path / ".local/state/ate"
    run = ate("status", env={"ATE_STATE_DIR": str(tmp_path / "env")})
    assert str(tmp_path / "env") in error_line(run)
    # --state-dir wins, before or after the command
    flag = ate("--state-dir", str(tmp_path / "flag"), "status", env={"ATE_STATE_DIR": "/x"})
    assert str(tmp_path / "flag") in error_line(flag)


def test_runtime_choice() -> None:
    assert choose_runtime("auto", euid=1000, path="")[0] == "fake"
    assert "not running as root" in choose_runtime("auto", euid=1000, path="")[1]
    assert choose_runtime("auto", euid=0, path="/nonexistent") == (
        "fake",
        "gVisor is not available (runsc, nft, ip not found): the workers use the fake "
        "runtime, in-process stand-ins for sandboxes",
    )
    assert choose_runtime("fake", euid=0, path=os.defpath) == ("fake", "")
    with pytest.raises(FailedPrecondition, match="needs root"):
        choose_runtime("gvisor", euid=1000, path=os.defpath)


def test_the_counter_template_file() -> None:
    t = parse_template(TEMPLATE.read_text(), atespace="demo")
    assert str(t.ref) == "demo/counter"
    assert t.sandbox_class is SandboxClass.GVISOR
    assert (t.resources.cpu_milli, t.resources.memory_bytes) == (100, 64 << 20)
    (c,) = t.containers
    assert c.image == "counter:1"
    assert [(e.name, e.value) for e in c.env] == [("STATE_DIR", "/tmp/state")]
    assert c.wakeup_probe is not None and c.wakeup_probe.path == "/readyz"
    # the printed shape reads back as the same template (JSON is YAML too)
    again = parse_template(json.dumps(template_to_data(t)))
    assert again == t


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\ncontainers: []", "containers must be a non-empty list"),
        ("name: x\ncontainers: [{name: a, image: i}]\ncolour: red", "unknown field 'colour'"),
        ("name: x\natespace: b\ncontainers: [{name: a, image: i}]", "names atespace 'b'"),
        ("name: x\ncontainers: [{name: a, image: i}]\nsandboxClass: vm", "sandboxClass 'vm'"),
        ("name: x\ncontainers: [{name: a, image: i}]\nresources: {memory: lots}", "memory"),
        ("name: Bad_Name\ncontainers: [{name: a, image: i}]", "is invalid"),
        ("[unclosed", "not valid YAML or JSON"),
    ],
)
def test_bad_template_files(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")):
        parse_template(text, atespace="a")


# --- with a stack ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("ate") / "state"
    run = ate(
        "up", "--runtime=fake", "--nodes=1", "--workers-per-node=2", "--timeout=60", state_dir=state
    )
    try:
        assert run.code == 0, run
        yield state
    finally:
        down = ate("down", "--purge", state_dir=state)
        assert down.code == 0, down


@pytest.mark.e2e
def test_up_prints_the_endpoints_and_refuses_a_second_stack(stack: Path) -> None:
    again = ate("up", "--runtime=fake", state_dir=stack)
    assert again.code == 1
    assert error_line(again).startswith(
        f"error: FAILED_PRECONDITION: a stack is already up in {stack} "
    )
    status = ate("status", "-o", "json", state_dir=stack)
    assert status.code == 0, status
    data = json.loads(status.out)
    s = read_local_stack(stack)
    assert data["routerUrl"] == s.router_url and data["routerUrl"].startswith("http://127.0.0.1:")
    assert data["ateapiAddress"] == s.ateapi_address
    assert data["nodes"] == {
        "node-1": {
            "directory": str(stack / "nodes" / "node-1"),
            "workers": ["node-1-w1", "node-1-w2"],
        }
    }
    assert data["runtime"] == "fake" and data["ateapiHealthy"] and data["routerReady"]
    assert {p["name"] for p in data["processes"]} == {
        "ateapi",
        "router",
        "atelet-node-1",
        "worker-node-1-w1",
        "worker-node-1-w2",
    }
    assert all(p["alive"] for p in data["processes"])
    table = ate("status", state_dir=stack)
    assert table.code == 0 and f"router      {s.router_url}" in table.out


@pytest.mark.e2e
def test_atespaces_and_templates(stack: Path) -> None:
    run = ate("create", "atespace", "lab", state_dir=stack)
    assert (run.code, run.out) == (0, 'atespace "lab" created\n')
    dup = ate("create", "atespace", "lab", state_dir=stack)
    assert dup.code == 1 and error_line(dup).startswith("error: ALREADY_EXISTS: ")
    bad = ate("create", "atespace", "Not_A_Name", state_dir=stack)
    assert bad.code == 1
    assert error_line(bad).startswith("error: INVALID_ARGUMENT: atespace 'Not_A_Name' is invalid")

    warned = ate("create", "template", "-f", str(TEMPLATE), "-a", "lab", state_dir=stack)
    assert warned.code == 0, warned
    assert "the local stack runs the fake runtime" in warned.err
    assert ate("delete", "template", "counter", "-a", "lab", state_dir=stack).code == 0
    created = ate(
        "create", "template", "-f", str(TEMPLATE), "-a", "lab", "--sandbox-class=fake",
        state_dir=stack,
    )  # fmt: skip
    assert (created.code, created.out) == (0, 'template "lab/counter" created\n')
    missing = ate("create", "template", "-f", "/nonexistent.yaml", "-a", "lab", state_dir=stack)
    assert error_line(missing) == "error: NOT_FOUND: template file /nonexistent.yaml does not exist"
    no_space = ate("create", "template", "-f", str(TEMPLATE), "-a", "nope", state_dir=stack)
    assert no_space.code == 1
    assert error_line(no_space) == "error: FAILED_PRECONDITION: Atespace nope not found"

    listed = ate("get", "templates", state_dir=stack)
    assert listed.out.splitlines()[0].split() == [
        "ATESPACE", "NAME", "IMAGE", "CLASS", "CPU", "MEMORY", "GOLDEN", "AGE"
    ]  # fmt: skip
    assert listed.out.splitlines()[1].split()[:6] == [
        "lab", "counter", "counter:1", "fake", "100m", "64Mi"
    ]  # fmt: skip
    as_yaml = yaml.safe_load(
        ate("get", "template", "counter", "-a", "lab", "-o", "yaml", state_dir=stack).out
    )
    assert as_yaml["containers"][0]["env"] == {"STATE_DIR": "/tmp/state"}
    spaces = json.loads(ate("get", "atespaces", "-o", "json", state_dir=stack).out)
    assert [s["name"] for s in spaces] == ["lab"]
    unnamed = ate("get", "template", "counter", state_dir=stack)
    assert error_line(unnamed).startswith("error: INVALID_ARGUMENT: a template is named within")


@pytest.mark.e2e
def test_actor_lifecycle_and_calls(stack: Path) -> None:
    run = ate("create", "actor", "a1", "-a", "lab", "--template", "counter", state_dir=stack)
    assert (run.code, run.out) == (0, 'actor "lab/a1" created from template counter (SUSPENDED)\n')
    unknown_template = ate(
        "create", "actor", "a2", "-a", "lab", "--template", "nope", state_dir=stack
    )
    assert unknown_template.code == 1
    assert error_line(unknown_template) == (
        "error: FAILED_PRECONDITION: ActorTemplate lab/nope not found"
    )
    bad = ate("create", "actor", "A_1", "-a", "lab", "--template", "counter", state_dir=stack)
    assert error_line(bad).startswith("error: INVALID_ARGUMENT: ")

    first = ate("call", "lab/a1", state_dir=stack)
    assert first.code == 0, first
    lines = first.out.splitlines()
    assert lines[0].startswith("HTTP 200 OK")
    assert "x-ate-restored-from: cold-boot" in lines
    assert lines[-1].startswith("count=1 boot=")

    suspended = ate("suspend", "actor", "a1", "-a", "lab", state_dir=stack)
    assert suspended.code == 0, suspended
    assert suspended.out.startswith(
        'actor "lab/a1" SUSPENDED (snapshot generation 1: local+durable)'
    )
    assert "suspending lab/a1" in suspended.err  # progress
    resumed = ate("resume", "actor", "a1", "-a", "lab", state_dir=stack)
    assert resumed.code == 0, resumed
    assert (
        "RUNNING on node-1-w" in resumed.out
        and "(restored from local, generation 1)" in resumed.out
    )
    second = ate("call", "lab/a1", "/", state_dir=stack)
    assert second.out.splitlines()[-1].startswith("count=2 "), second

    paused = ate("pause", "actor", "a1", "-a", "lab", state_dir=stack)
    assert paused.out.startswith('actor "lab/a1" PAUSED (snapshot generation 2: local)'), paused
    again = ate("resume", "actor", "a1", "-a", "lab", state_dir=stack)
    assert "(restored from local, generation 2)" in again.out
    already = ate("resume", "actor", "a1", "-a", "lab", state_dir=stack)
    assert "(it was already running)" in already.out
    reverted = ate("revert", "actor", "a1", "-a", "lab", state_dir=stack)
    assert reverted.out.startswith('actor "lab/a1" SUSPENDED (snapshot generation 1: durable)'), (
        reverted
    )
    third = ate("call", "lab/a1", state_dir=stack)
    assert "x-ate-restored-from: durable" in third.out
    assert third.out.splitlines()[-1].startswith("count=2 "), third  # the durable value + 1

    actors = ate("get", "actors", "-a", "lab", state_dir=stack)
    row = actors.out.splitlines()[1].split()
    assert row[:3] == ["lab", "a1", "RUNNING"]
    one = json.loads(ate("get", "actor", "a1", "-a", "lab", "-o", "json", state_dir=stack).out)
    assert one["state"] == "RUNNING" and one["worker"].startswith("node-1-w")

    async_suspend = ate("suspend", "actor", "a1", "-a", "lab", "--mode", "async", state_dir=stack)
    assert async_suspend.code == 0 and "SUSPENDED" in async_suspend.out
    wrong_state = ate("pause", "actor", "a1", "-a", "lab", state_dir=stack)
    assert wrong_state.code == 1
    assert error_line(wrong_state).startswith("error: FAILED_PRECONDITION: ")


@pytest.mark.e2e
def test_unknown_actors(stack: Path) -> None:
    for argv in (
        ["get", "actor", "ghost", "-a", "lab"],
        ["suspend", "actor", "ghost", "-a", "lab"],
        ["pause", "actor", "ghost", "-a", "lab"],
        ["resume", "actor", "ghost", "-a", "lab"],
        ["revert", "actor", "ghost", "-a", "lab"],
        ["delete", "actor", "ghost", "-a", "lab"],
        ["create", "tag", "t", "-a", "lab", "--actor", "ghost"],
    ):
        run = ate(*argv, state_dir=stack)
        assert run.code == 1, (argv, run)
        assert error_line(run).startswith("error: NOT_FOUND: "), (argv, run)
        assert "ghost" in error_line(run)
    call = ate("call", "lab/ghost", state_dir=stack)
    assert call.code == 1
    assert call.out.startswith("HTTP 404 Not Found")
    assert error_line(call) == "error: HTTP_404: actor lab/ghost not found"
    bad = ate("call", "lab", state_dir=stack)
    assert error_line(bad).startswith("error: INVALID_ARGUMENT: actor reference 'lab'")
    for kind in ("tag", "template"):
        run = ate("delete", kind, "ghost", "-a", "lab", state_dir=stack)
        assert error_line(run).startswith("error: NOT_FOUND: "), run
    run = ate("get", "worker", "ghost", state_dir=stack)
    assert error_line(run).startswith("error: NOT_FOUND: ")
    run = ate("drain", "worker", "ghost", state_dir=stack)
    assert error_line(run).startswith("error: NOT_FOUND: ")


@pytest.mark.e2e
def test_tags(stack: Path) -> None:
    ate("create", "actor", "t1", "-a", "lab", "--template", "counter", state_dir=stack)
    assert ate("call", "lab/t1", state_dir=stack).code == 0
    running = ate("create", "tag", "gold", "-a", "lab", "--actor", "t1", state_dir=stack)
    assert error_line(running).startswith("error: FAILED_PRECONDITION: Actor lab/t1 must be ")
    ate("suspend", "actor", "t1", "-a", "lab", state_dir=stack)
    tagged = ate("create", "tag", "gold", "-a", "lab", "--actor", "t1", state_dir=stack)
    assert tagged.code == 0, tagged
    assert tagged.out.startswith('tag "lab/gold" created from actor t1 (snapshot ')
    child = ate("create", "actor", "t2", "-a", "lab", "--tag", "gold", state_dir=stack)
    assert child.out == 'actor "lab/t2" created from tag gold (SUSPENDED)\n', child
    call = ate("call", "lab/t2", state_dir=stack)
    assert "x-ate-restored-from: tag" in call.out
    assert call.out.splitlines()[-1].startswith("count=2 "), call
    tags = ate("get", "tags", "-a", "lab", state_dir=stack)
    assert tags.out.splitlines()[1].split()[:4] == ["lab", "gold", "t1", "counter"]
    borrowed = ate("delete", "tag", "gold", "-a", "lab", state_dir=stack)
    assert error_line(borrowed).startswith("error: FAILED_PRECONDITION: Tag lab/gold is still")
    assert ate("delete", "actor", "t2", "-a", "lab", "--force", state_dir=stack).code == 0
    deleted = ate("delete", "tag", "gold", "-a", "lab", state_dir=stack)
    assert (deleted.code, deleted.out) == (0, 'tag "lab/gold" deleted\n')


@pytest.mark.e2e
def test_call_with_a_body_and_headers(stack: Path, tmp_path: Path) -> None:
    # the counter answers 405 to anything but GET: the request still went through
    run = ate("call", "lab/t1", "/", "-d", "hello", "-H", "X-Demo: 1", state_dir=stack)
    assert run.code == 1
    assert run.out.startswith("HTTP 405 Method Not Allowed")
    assert error_line(run) == "error: HTTP_405: method not allowed"
    body = tmp_path / "body"
    body.write_text("x")
    run = ate("call", "lab/t1", "/readyz", "-X", "GET", "-d", f"@{body}", state_dir=stack)
    assert run.code == 0 and run.out.splitlines()[-1] == "ok", run
    missing = ate("call", "lab/t1", "-d", "@/nonexistent", state_dir=stack)
    assert error_line(missing).startswith("error: INVALID_ARGUMENT: cannot read /nonexistent")
    bad_header = ate("call", "lab/t1", "-H", "nocolon", state_dir=stack)
    assert error_line(bad_header).startswith("error: INVALID_ARGUMENT: header 'nocolon'")


@pytest.mark.e2e
def test_proxy_forwards_to_the_actor(stack: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "substrate.cli", "proxy", "lab/t1", f"--port={port}"],
        cwd=ROOT,
        env={**os.environ, "ATE_STATE_DIR": str(stack)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert banner.startswith(f"forwarding http://127.0.0.1:{port} to lab/t1 through http://")
        with urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert r.status == 200
            assert r.read().decode().startswith("count=")
        with urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as r:
            assert r.read() == b"ok"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert "GET / -> 200" in err


@pytest.mark.e2e
def test_top_and_workers(stack: Path) -> None:
    run = ate("top", "--once", state_dir=stack)
    assert run.code == 0, run
    assert run.out.startswith("ate top — ")
    assert "node-1-w1" in run.out and "lab" in run.out
    workers = ate("get", "workers", "-o", "yaml", state_dir=stack)
    data = yaml.safe_load(workers.out)
    assert sorted(w["name"] for w in data) == ["node-1-w1", "node-1-w2"]
    assert all(w["state"] == "ACTIVE" and w["sandboxClass"] == "fake" for w in data)


@pytest.mark.e2e
def test_drain_and_deletes(stack: Path) -> None:
    drained = ate("drain", "worker", "node-1-w2", state_dir=stack)
    assert drained.code == 0, drained
    assert drained.out.startswith('worker "node-1-w2" DRAINING')
    assert "DRAINING" in ate("get", "worker", "node-1-w2", state_dir=stack).out
    busy = ate("delete", "atespace", "lab", state_dir=stack)
    assert busy.code == 1 and error_line(busy).startswith("error: FAILED_PRECONDITION: ")
    running = ate("delete", "actor", "t1", "-a", "lab", state_dir=stack)
    assert error_line(running).startswith(
        "error: FAILED_PRECONDITION: Actor lab/t1 is not in a deletable state"
    )
    forced = ate("delete", "actor", "t1", "-a", "lab", "--force", state_dir=stack)
    assert (forced.code, forced.out) == (0, 'actor "lab/t1" deleted\n')
    assert ate("delete", "actor", "a1", "-a", "lab", "--force", state_dir=stack).code == 0
    assert ate("delete", "template", "counter", "-a", "lab", state_dir=stack).code == 0
    deleted = ate("delete", "atespace", "lab", state_dir=stack)
    assert (deleted.code, deleted.out) == (0, 'atespace "lab" deleted\n')
    assert ate("get", "actors", state_dir=stack).out == "No actors found.\n"


@pytest.mark.e2e
def test_down_stops_everything(tmp_path: Path) -> None:
    """A stack of its own: ``ate down`` leaves no process of it behind."""
    state = tmp_path / "state"
    up = ate("up", "--runtime=fake", "--nodes=1", "--workers-per-node=1", state_dir=state)
    assert up.code == 0, up
    recorded = read_local_stack(state).processes
    down = ate("down", state_dir=state)
    assert down.code == 0, down
    assert down.out.startswith("the local stack is down: stopped 4 process(es)")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p.pid}").exists() for p in recorded):
        time.sleep(0.1)
    assert not any(procfs.alive(p.pid, p.start_ticks) for p in recorded)
    assert not (state / "stack.json").exists()
    assert (state / "pki" / "ca.crt").exists(), "the PKI stays for the next ate up"


def test_free_ports_come_from_below_the_ephemeral_range() -> None:
    """So no outgoing connection of the stack can take a port before its daemon binds it."""
    low, _ = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports), ports
    assert len(ports) > 1  # random, not a fixed port
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # and free
