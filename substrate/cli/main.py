"""``ate``: the command line (argparse, verb-noun). See ``ate --help``.

Every command takes ``--state-dir DIR`` (default ``$ATE_STATE_DIR``, else
``$XDG_STATE_HOME/ate``, else ``~/.local/state/ate``): the local stack's directory, where
``ate up`` keeps its state file, certificates, logs, node directories and objects, and
where the other commands find the endpoints and the client's credentials.

Errors are one line on stderr, ``error: <CODE>: <description>`` (the gRPC status name),
with exit status 1; usage errors exit with 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, NoReturn, TextIO

import anyio
import attrs

from substrate.cli import stack as stack_mod
from substrate.cli.output import FORMATS, dump, render, table
from substrate.client import AteClient
from substrate.client.http import DEFAULT_HTTP_TIMEOUT, ActorResponse, call_actor
from substrate.client.local import (
    STATE_DIR_ENV,
    LocalStack,
    connect_local,
    default_state_dir,
    read_local_stack,
    redact_url,
)
from substrate.client.manifest import load_template, to_data
from substrate.core.ids import ActorRef, Labels
from substrate.core.model import (
    Actor,
    SandboxClass,
    SuspendMode,
)
from substrate.errors import GrpcCode, InvalidArgument, NotFound, SubstrateError, Unavailable

PROG: Final = "ate"
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
SPINNER: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


# --- the context of one command ---------------------------------------------------------------


@attrs.define
class Ctx:
    state_dir: Path
    env: Mapping[str, str]
    out: TextIO
    err: TextIO

    @property
    def tty(self) -> bool:
        isatty = getattr(self.err, "isatty", None)
        return bool(isatty and isatty())

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def note(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def step(self, text: str) -> None:
        """A progress line of a long operation (stderr)."""
        self.note(f"  · {text}")

    @asynccontextmanager
    async def progress(self, text: str) -> AsyncIterator[None]:
        """Show that ``text`` is under way: a spinner on a terminal, else one line."""
        if not self.tty:
            self.note(f"{text} …")
            yield
            return
        started = time.monotonic()

        async def spin() -> None:
            i = 0
            while True:
                elapsed = time.monotonic() - started
                self.err.write(f"\r{SPINNER[i % len(SPINNER)]} {text} ({elapsed:.1f}s)")
                self.err.flush()
                i += 1
                await anyio.sleep(0.1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(spin)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                self.err.write("\r\x1b[K")
                self.err.flush()

    @asynccontextmanager
    async def client(self) -> AsyncIterator[AteClient]:
        async with connect_local(self.state_dir) as client:
            yield client

    def stack(self) -> LocalStack:
        return read_local_stack(self.state_dir)


Command = Callable[[Ctx, argparse.Namespace], Awaitable[int]]


# --- argument parsing -------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse with substrate's one-line errors (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT_USAGE,
            f"error: {GrpcCode.INVALID_ARGUMENT.name}: {message} (see `{self.prog} --help`)\n",
        )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port {text!r} must be in 1..65535")
    return value


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key, value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help=f"the local stack's directory (default: ${STATE_DIR_ENV}, else "
        "$XDG_STATE_HOME/ate, else ~/.local/state/ate)",
    )


def _atespace(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument(
        "-a",
        "--atespace",
        required=required,
        help="the atespace" + ("" if required else " (default: all)"),
    )


def _output(p: argparse.ArgumentParser, default: str = "table") -> None:
    p.add_argument("-o", "--output", choices=FORMATS, default=default, help=f"default {default}")


def _sub(
    parent: Any, name: str, fn: Command, help_text: str, *, aliases: Sequence[str] = ()
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = parent.add_parser(
        name, help=help_text, description=help_text, aliases=list(aliases)
    )
    _common(p)
    p.set_defaults(fn=fn)
    return p


def _verb(parent: Any, name: str, help_text: str) -> Any:
    p: argparse.ArgumentParser = parent.add_parser(name, help=help_text, description=help_text)
    _common(p)
    sub = p.add_subparsers(dest="noun", metavar="NOUN", required=True)
    return sub


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="substrate's command line: a local stack (ate up/down/status), actors, "
        "templates, tags and workers, and HTTP calls to actors through the router.",
        epilog="Start with `ate up`, then `ate create atespace demo`, "
        "`ate create template -f examples/counter/template.yaml -a demo`, "
        "`ate create actor c1 -a demo --template counter`, `ate call demo/c1`.",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"the local stack's directory (default: ${STATE_DIR_ENV}, else "
        "$XDG_STATE_HOME/ate, else ~/.local/state/ate)",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    p = _sub(verbs, "up", cmd_up, "start the local stack (ateapi, router, nodes and workers)")
    p.add_argument("--nodes", type=_positive_int, default=2, help="nodes (default 2)")
    p.add_argument(
        "--workers-per-node", type=_positive_int, default=2, help="workers per node (default 2)"
    )
    p.add_argument(
        "--store", default="memory://", help="memory:// (default) or postgresql://user@host/db"
    )
    p.add_argument(
        "--objects",
        default="",
        help="snapshot object store URL (default file://<state-dir>/objects)",
    )
    p.add_argument(
        "--runtime",
        choices=stack_mod.RUNTIMES,
        default="auto",
        help="gvisor (root, runsc), fake (in-process stand-ins), or auto (default: gvisor "
        "when possible)",
    )
    p.add_argument(
        "--max-actors", type=_positive_int, default=8, help="actor slots per worker (default 8)"
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=stack_mod.READY_TIMEOUT,
        help="seconds to wait for readiness",
    )

    p = _sub(verbs, "down", cmd_down, "stop the local stack and remove what it left behind")
    p.add_argument(
        "--purge",
        action="store_true",
        help="also delete the state directory (snapshots, certificates, logs)",
    )

    p = _sub(verbs, "status", cmd_status, "the local stack's endpoints, processes and workers")
    _output(p)

    create = _verb(verbs, "create", "create an atespace, template, actor or tag")
    p = _sub(create, "atespace", cmd_create_atespace, "create an atespace")
    p.add_argument("name")
    p = _sub(create, "template", cmd_create_template, "create a template from a YAML/JSON file")
    p.add_argument("-f", "--file", required=True, type=Path, help="the template file")
    _atespace(p, required=False)
    p.add_argument(
        "--sandbox-class",
        choices=[c.name.lower() for c in SandboxClass],
        help="override the file's sandboxClass (e.g. fake on a stack without gVisor)",
    )
    p = _sub(create, "actor", cmd_create_actor, "create a (suspended) actor")
    p.add_argument("name")
    _atespace(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--template", help="the template to boot from")
    source.add_argument("--tag", help="the tag whose snapshot the actor starts from")
    p.add_argument(
        "--selector",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="worker selector label (repeat)",
    )
    p = _sub(create, "tag", cmd_create_tag, "tag a suspended actor's newest snapshot")
    p.add_argument("name")
    _atespace(p)
    p.add_argument("--actor", required=True, help="the (suspended) actor to tag")

    get = _verb(verbs, "get", "list or show atespaces, templates, actors, tags or workers")
    for kind, single in (
        ("atespaces", "atespace"),
        ("templates", "template"),
        ("actors", "actor"),
        ("tags", "tag"),
        ("workers", "worker"),
    ):
        p = _sub(get, kind, cmd_get, f"list {kind}, or show one by name", aliases=[single])
        p.set_defaults(kind=kind)
        p.add_argument("name", nargs="?", help=f"show this {single} only")
        if kind in ("templates", "actors", "tags"):
            _atespace(p, required=False)
        _output(p)

    for verb, help_text in (
        ("suspend", "suspend an actor to a snapshot"),
        ("pause", "pause an actor (a node-local snapshot; resumes fast, in place)"),
        ("resume", "resume an actor (calls through the router resume it too)"),
        ("revert", "revert an actor to its last durable snapshot"),
    ):
        sub = _verb(verbs, verb, help_text)
        p = _sub(sub, "actor", cmd_actor_op, help_text)
        p.set_defaults(op=verb)
        p.add_argument("name")
        _atespace(p)
        if verb == "suspend":
            p.add_argument(
                "--mode",
                choices=("sync", "async"),
                default="sync",
                help="sync: return once the snapshot is durable (default); async: once "
                "it is taken, uploading in the background",
            )

    delete = _verb(verbs, "delete", "delete an actor, tag, template or atespace")
    p = _sub(delete, "actor", cmd_delete, "delete an actor and its snapshots")
    p.set_defaults(kind="actor")
    p.add_argument("name")
    _atespace(p)
    p.add_argument("--force", action="store_true", help="also from a crashed or stuck state")
    for kind in ("tag", "template"):
        p = _sub(delete, kind, cmd_delete, f"delete a {kind}")
        p.set_defaults(kind=kind, force=False)
        p.add_argument("name")
        _atespace(p)
    p = _sub(delete, "atespace", cmd_delete, "delete an (empty) atespace")
    p.set_defaults(kind="atespace", force=False, atespace=None)
    p.add_argument("name")

    drain = _verb(verbs, "drain", "drain a worker")
    p = _sub(drain, "worker", cmd_drain, "mark a worker DRAINING and suspend its actors")
    p.add_argument("name")

    p = _sub(verbs, "call", cmd_call, "send an HTTP request to an actor through the router")
    p.add_argument("actor", help="ATESPACE/NAME")
    p.add_argument("path", nargs="?", default="/", help="request path (default /)")
    p.add_argument("-X", "--method", help="HTTP method (default GET, POST with -d)")
    p.add_argument("-d", "--data", help="request body (@FILE reads a file)")
    p.add_argument("-H", "--header", action="append", default=[], help="'Name: value' (repeat)")
    p.add_argument("--port", type=_port, help="the actor's port (default 80)")
    p.add_argument("--timeout", type=_positive_float, default=DEFAULT_HTTP_TIMEOUT, help="seconds")

    p = _sub(verbs, "proxy", cmd_proxy, "forward a local plain-HTTP port to an actor")
    p.add_argument("actor", help="ATESPACE/NAME")
    p.add_argument("--port", type=_port, required=True, help="the local port to listen on")
    p.add_argument("--target-port", type=_port, help="the actor's port (default 80)")
    p.add_argument("--address", default="127.0.0.1", help="local address (default 127.0.0.1)")

    p = _sub(verbs, "top", cmd_top, "workers and actors, refreshed")
    p.add_argument("--interval", type=_positive_float, default=2.0, help="seconds (default 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    _atespace(p, required=False)
    return parser


# --- the stack ---------------------------------------------------------------------------------


def summary(stack: LocalStack) -> list[str]:
    lines = [
        f"state dir   {stack.state_dir}",
        f"runtime     {stack.runtime}" + (f"  ({stack.note})" if stack.note else ""),
        f"router      {stack.router_url}   (admin http://{stack.router_admin}/statusz)",
        f"ateapi      {stack.ateapi_address}   (admin http://{stack.ateapi_admin}/metrics)",
        f"store       {stack.store_redacted}",
        f"objects     {stack.objects}",
        f"client TLS  {stack.tls_dir}",
        f"logs        {stack.state_dir / 'logs'}",
    ]
    lines += [
        f"node        {node.name}: {node.directory}  workers {', '.join(node.workers)}"
        for node in stack.nodes
    ]
    return lines


async def cmd_up(ctx: Ctx, args: argparse.Namespace) -> int:
    started = time.monotonic()
    ctx.note(f"starting the local stack in {ctx.state_dir}")
    options = stack_mod.UpOptions(
        state_dir=ctx.state_dir,
        nodes=args.nodes,
        workers_per_node=args.workers_per_node,
        store=args.store,
        objects=args.objects,
        runtime=args.runtime,
        max_actors=args.max_actors,
        env=dict(ctx.env),
        python=sys.executable,
        ready_timeout=args.timeout,
    )
    stack = await stack_mod.up(options, ctx.step)
    ctx.print(f"the local stack is up ({time.monotonic() - started:.1f}s)")
    for line in summary(stack):
        ctx.print(f"  {line}")
    hint = "" if ctx.state_dir == default_state_dir(ctx.env) else f" --state-dir {ctx.state_dir}"
    ctx.print(f"stop it with: ate down{hint}")
    return 0


async def cmd_down(ctx: Ctx, args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        report = await stack_mod.down(ctx.state_dir, ctx.step, purge=args.purge)
    except NotFound:
        ctx.print(f"no local stack is up in {ctx.state_dir}; nothing to stop")
        return 0
    killed = f"; killed {', '.join(report.killed)}" if report.killed else ""
    leftovers = f"; removed {len(report.leftovers)} leftover(s)" if report.leftovers else ""
    ctx.print(
        f"the local stack is down: stopped {len(report.stopped) + len(report.killed)} "
        f"process(es){killed}{leftovers} ({time.monotonic() - started:.1f}s)"
    )
    if args.purge:
        ctx.print(f"removed {ctx.state_dir}")
    return 0


async def cmd_status(ctx: Ctx, args: argparse.Namespace) -> int:
    data = await stack_mod.status(ctx.state_dir)
    if args.output != "table":
        ctx.print(dump(data, args.output))
        return 0
    stack = ctx.stack()
    ctx.print("\n".join(summary(stack)))
    ctx.print(
        f"health      ateapi {'healthy' if data['ateapiHealthy'] else 'NOT answering'}, "
        f"router {'ready' if data['routerReady'] else 'NOT ready'}"
    )
    ctx.print()
    ctx.print(
        table(
            ["PROCESS", "PID", "ALIVE", "LOG"],
            [
                (p["name"], p["pid"], "yes" if p["alive"] else "NO", p["log"])
                for p in data["processes"]
            ],
        )
    )
    if data["workers"]:
        ctx.print()
        ctx.print(
            table(
                ["WORKER", "NODE", "STATE", "ACTORS"],
                [
                    (w["name"], w["node"], w["state"], f"{w['actors']}/{w['capacity']}")
                    for w in data["workers"]
                ],
            )
        )
    dead = [p["name"] for p in data["processes"] if not p["alive"]]
    if dead:
        raise Unavailable(
            f"{len(dead)} process(es) of the stack are not running: {', '.join(dead)} "
            "(see their logs; `ate down` then `ate up` restarts the stack)"
        )
    return 0


# --- create ---------------------------------------------------------------------------------


async def cmd_create_atespace(ctx: Ctx, args: argparse.Namespace) -> int:
    async with ctx.client() as c:
        created = await c.create_atespace(args.name)
    ctx.print(f'atespace "{created.name}" created')
    return 0


async def cmd_create_template(ctx: Ctx, args: argparse.Namespace) -> int:
    template = load_template(args.file, atespace=args.atespace)
    if args.sandbox_class:
        template = attrs.evolve(template, sandbox_class=SandboxClass[args.sandbox_class.upper()])
    runtime = ""
    with contextlib.suppress(SubstrateError):
        runtime = ctx.stack().runtime
    if runtime == "fake" and template.sandbox_class is not SandboxClass.FAKE:
        ctx.note(
            f"note: the local stack runs the fake runtime; this template asks for "
            f"{template.sandbox_class.name.lower()} sandboxes, which no worker runs "
            "(use --sandbox-class fake)"
        )
    async with ctx.client() as c:
        created = await c.create_template(template)
    ctx.print(f'template "{created.ref}" created')
    return 0


async def cmd_create_actor(ctx: Ctx, args: argparse.Namespace) -> int:
    ref = f"{args.atespace}/{args.name}"
    async with ctx.client() as c:
        created = await c.create_actor(
            ref,
            template=f"{args.atespace}/{args.template}" if args.template else None,
            source_tag=f"{args.atespace}/{args.tag}" if args.tag else None,
            worker_selector=Labels(dict(args.selector)),
        )
    origin = f"tag {args.tag}" if args.tag else f"template {args.template}"
    ctx.print(f'actor "{created.ref}" created from {origin} ({created.state.name})')
    return 0


async def cmd_create_tag(ctx: Ctx, args: argparse.Namespace) -> int:
    async with ctx.client() as c, ctx.progress(f"tagging {args.atespace}/{args.actor}"):
        tag = await c.create_tag(f"{args.atespace}/{args.name}", f"{args.atespace}/{args.actor}")
    gen = tag.snapshot.snapshot_id if tag.snapshot else "-"
    ctx.print(f'tag "{tag.ref}" created from actor {args.actor} (snapshot {gen})')
    return 0


# --- get ---------------------------------------------------------------------------------------


async def _records(c: AteClient, kind: str, name: str | None, atespace: str | None) -> list[Any]:
    if kind == "atespaces":
        return [await c.get_atespace(name)] if name else await c.list_atespaces()
    if kind == "workers":
        return [await c.get_worker(name)] if name else await c.list_workers()
    if name:
        if atespace is None:
            raise InvalidArgument(f"a {kind[:-1]} is named within an atespace: pass -a ATESPACE")
        ref = f"{atespace}/{name}"
        if kind == "templates":
            return [await c.get_template(ref)]
        if kind == "actors":
            return [await c.get_actor(ref)]
        return [await c.get_tag(ref)]
    if kind == "actors":
        return [a async for a in c.list_actors(atespace)]
    spaces = [atespace] if atespace else [a.name for a in await c.list_atespaces()]
    out: list[Any] = []
    for space in spaces:
        out += await (c.list_templates(space) if kind == "templates" else c.list_tags(space))
    return out


async def cmd_get(ctx: Ctx, args: argparse.Namespace) -> int:
    async with ctx.client() as c:
        records = await _records(c, args.kind, args.name, getattr(args, "atespace", None))
    if args.name and args.output != "table":
        ctx.print(dump(to_data(records[0]), args.output))
    else:
        ctx.print(render(args.kind, records, args.output, now=time.time()))
    return 0


# --- actor operations ------------------------------------------------------------------------


def _describe(actor: Actor) -> str:
    st = actor.status
    parts = [actor.state.name]
    if st.assignment is not None:
        parts.append(f"on {st.assignment.worker.name}")
    if st.snapshots:
        newest = max(st.snapshots, key=lambda s: s.generation)
        where = "+".join(x.durability.name.lower() for x in newest.storages if x.completed)
        parts.append(f"(snapshot generation {newest.generation}: {where or 'pending'})")
    if st.crash is not None:
        parts.append(f"(crashed: {st.crash.message})")
    return " ".join(parts)


async def cmd_actor_op(ctx: Ctx, args: argparse.Namespace) -> int:
    ref = f"{args.atespace}/{args.name}"
    started = time.monotonic()
    verbs = {
        "suspend": "suspending",
        "pause": "pausing",
        "resume": "resuming",
        "revert": "reverting",
    }
    async with ctx.client() as c, ctx.progress(f"{verbs[args.op]} {ref}"):
        if args.op == "suspend":
            mode = SuspendMode.SYNC if args.mode == "sync" else SuspendMode.ASYNC
            actor = await c.suspend_actor(ref, mode)
            extra = ""
        elif args.op == "pause":
            actor = await c.pause_actor(ref)
            extra = ""
        elif args.op == "revert":
            actor = await c.revert_actor(ref)
            extra = ""
        else:
            result = await c.resume_actor(ref)
            actor = result.actor
            if not result.resumed:
                extra = " (it was already running)"
            elif result.cold_boot:
                extra = " (cold boot)"
            else:
                extra = f" (restored from {result.provenance}, generation {result.generation})"
    elapsed = time.monotonic() - started
    ctx.print(f'actor "{ref}" {_describe(actor)}{extra} in {elapsed:.2f}s')
    return 0


async def cmd_delete(ctx: Ctx, args: argparse.Namespace) -> int:
    ref = args.name if args.kind == "atespace" else f"{args.atespace}/{args.name}"
    async with ctx.client() as c, ctx.progress(f"deleting {args.kind} {ref}"):
        if args.kind == "actor":
            await c.delete_actor(ref, force=args.force)
        elif args.kind == "tag":
            await c.delete_tag(ref)
        elif args.kind == "template":
            await c.delete_template(ref)
        else:
            await c.delete_atespace(ref)
    ctx.print(f'{args.kind} "{ref}" deleted')
    return 0


async def cmd_drain(ctx: Ctx, args: argparse.Namespace) -> int:
    async with ctx.client() as c, ctx.progress(f"draining worker {args.name}"):
        worker = await c.drain_worker(args.name)
    ctx.print(
        f'worker "{worker.ref.name}" {worker.state.name} '
        f"({worker.allocated.actors} actor(s) still placed)"
    )
    return 0


# --- HTTP ------------------------------------------------------------------------------------


def _parse_headers(values: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for value in values:
        name, sep, text = value.partition(":")
        if not sep or not name.strip():
            raise InvalidArgument(f"header {value!r} must be 'Name: value'")
        out.append((name.strip(), text.strip()))
    return out


def _body(data: str | None) -> bytes:
    if data is None:
        return b""
    if data.startswith("@"):
        path = Path(data[1:])
        try:
            return path.read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {path}: {exc.strerror}") from None
    return data.encode()


def print_response(ctx: Ctx, answer: ActorResponse) -> None:
    ctx.print(f"HTTP {answer.status} {answer.reason}  ({answer.elapsed:.3f}s)")
    for name, value in answer.provenance.items():
        ctx.print(f"{name}: {value}")
    ctx.print()
    ctx.out.write(answer.text)
    if answer.text and not answer.text.endswith("\n"):
        ctx.out.write("\n")
    ctx.out.flush()


async def cmd_call(ctx: Ctx, args: argparse.Namespace) -> int:
    actor = ActorRef.parse(args.actor)
    body = _body(args.data)
    method = args.method or ("POST" if args.data is not None else "GET")
    answer = await call_actor(
        ctx.stack().router_url,
        actor,
        args.path,
        method=method.upper(),
        body=body,
        headers=_parse_headers(args.header),
        port=args.port,
        timeout=args.timeout,
    )
    print_response(ctx, answer)
    if answer.status >= 400:
        reason = answer.text.strip().splitlines()[0] if answer.text.strip() else answer.reason
        ctx.note(f"error: HTTP_{answer.status}: {reason}")
        return EXIT_ERROR
    return 0


async def cmd_proxy(ctx: Ctx, args: argparse.Namespace) -> int:
    from substrate.cli.proxy import serve_proxy

    actor = ActorRef.parse(args.actor)
    router = ctx.stack().router_url
    await serve_proxy(
        router,
        actor,
        host=args.address,
        port=args.port,
        target_port=args.target_port,
        log=ctx.note,
        ready=lambda bound: ctx.print(
            f"forwarding http://{args.address}:{bound} to {actor}"
            f"{f' port {args.target_port}' if args.target_port else ''} through {router} "
            "(Ctrl-C stops)"
        ),
    )
    return 0


# --- top ---------------------------------------------------------------------------------------


async def top_frame(c: AteClient, atespace: str | None, stack: LocalStack) -> str:
    workers = await c.list_workers()
    actors = [a async for a in c.list_actors(atespace)]
    now = time.time()
    states: dict[str, int] = {}
    for a in actors:
        states[a.state.name] = states.get(a.state.name, 0) + 1
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())) or "none"
    head = (
        f"ate top — {time.strftime('%H:%M:%S')} — {stack.runtime} runtime, router "
        f"{stack.router_url} — actors: {counts}"
    )
    return "\n".join(
        [
            head,
            "",
            render("workers", workers, "table", now=now),
            "",
            render("actors", actors, "table", now=now),
        ]
    )


async def cmd_top(ctx: Ctx, args: argparse.Namespace) -> int:
    stack = ctx.stack()
    async with ctx.client() as c:
        while True:
            frame = await top_frame(c, args.atespace, stack)
            if ctx.tty and not args.once:
                ctx.out.write("\x1b[H\x1b[2J")
            ctx.print(frame)
            if args.once:
                return 0
            await anyio.sleep(args.interval)


# --- entry point ------------------------------------------------------------------------------


def error_line(exc: SubstrateError) -> str:
    text = " ".join((exc.description or type(exc).__name__).split())
    return f"error: {exc.code.name}: {text}"


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one ``ate`` command; the exit status (0 ok, 1 error, 2 usage, 130 interrupted)."""
    env = dict(os.environ if environ is None else environ)
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    state_dir = getattr(args, "state_dir", None) or default_state_dir(env)
    ctx = Ctx(state_dir=Path(state_dir).expanduser().absolute(), env=env, out=out, err=err)
    fn: Command = args.fn
    try:
        return anyio.run(fn, ctx, args, backend="asyncio")
    except SubstrateError as exc:
        print(error_line(exc), file=err, flush=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=err, flush=True)
        return 130
    except BrokenPipeError:
        return EXIT_ERROR


__all__ = ["build_parser", "main", "redact_url"]
