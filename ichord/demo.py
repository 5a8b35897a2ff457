"""``ichord demo``: the daemon (``ichord run``) against a whole simulated cluster, in one process.

The simulators (Kubernetes API + Talos nodes, ``ichord sim``'s environment) and the daemon share one
event loop; the demo watches both from the inside (the API server's store and the Talos nodes'
history, so watching costs no API request) while it drives the cluster through the Kubernetes API
like an operator would: converge, a safe patch (one apply per node), a reboot-requiring patch
(reported, never applied), its removal. With a terminal a live table, otherwise one plain line per
transition. Exit 0 when every step did what it shows, 1 with the reason otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from ichord.api.contract import VersionContract, parse_contract
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import bundle_fingerprint
from ichord.pki.scrub import SCRUBBER
from ichord.render.generate import render
from ichord.settings import Timing

if TYPE_CHECKING:
    from ichord.daemon import Daemon
    from ichord.kube.client import KubeClient
    from ichord.sim.combined import SimEnvironment
    from ichord.sim.kube.events import Change
    from ichord.sim.kube.resources import ResourceType

SAFE_PATCH = 'machine:\n  sysctls:\n    net.core.somaxconn: "65535"\n'
REBOOT_PATCH = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n"


class DemoFailed(Exception):
    """A step did not happen as shown; the message says which and what was seen instead."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="run the daemon against a simulated cluster and show what it does",
        description="Start a simulated Talos cluster and its Kubernetes API, run the daemon against it in this "
        "process, and show machines converging, a safe patch applied once per node, and a reboot-requiring "
        "patch reported and never applied. Exit 0 when all of it happened.")
    p.add_argument("--control-planes", type=int, default=3)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--talos-version", default="v1.14", help="v1.13 or v1.14 (default %(default)s)")
    # Not much lower: the simulators share the daemon's event loop, and on a busy machine a shorter
    # lease renewal deadline (9 s here) makes the daemon step down (LeadershipLost) mid-demo.
    p.add_argument("--time-scale", type=float, default=0.1,
                   help="multiply every duration, the daemon's and the simulated ones, by this (default %(default)g: "
                   "the 120 s leader lease lasts 12 s)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds each step may take (default %(default)g)")
    p.add_argument("--bundle", type=Path, help="secrets bundle to use (default: a new one, in memory)")
    p.add_argument("--workdir", type=Path, help="where the daemon's log goes (default: a new temporary directory)")
    p.add_argument("--log-level", default="info", help="the daemon's log level (default %(default)s)")
    p.set_defaults(func=run)


class DemoArgumentError(IchordError):
    """A demo option is out of range."""


def run(args: argparse.Namespace) -> int:
    if args.control_planes < 1 or args.workers < 0:
        raise DemoArgumentError("--control-planes must be at least 1 and --workers at least 0")
    if args.time_scale <= 0 or args.timeout <= 0:
        raise DemoArgumentError("--time-scale and --timeout must be positive")
    contract = parse_contract(args.talos_version)
    bundle = SecretsBundle.load(args.bundle) if args.bundle else None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ichord-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    view: View = LiveTable(sys.stdout) if sys.stdout.isatty() else Lines(sys.stdout)
    demo = Demo(args, contract, bundle, workdir / "daemon.log", view)
    return anyio.run(demo.main, backend="asyncio")


# ---- what is seen ---------------------------------------------------------------------------


@dataclass
class Row:
    """One machine as the demo sees it: its Ready condition and the applies its node accepted."""

    name: str
    role: str
    node: str
    ready: str = "-"
    reason: str = "-"
    message: str = ""
    config_hash: str = ""
    reboot_paths: list[str] = field(default_factory=list)
    applies: list[tuple[str, str]] = field(default_factory=list)  # (config hash, mode)
    running: str = ""  # hash of the configuration the node runs (no-reboot applies take effect at once)


class Observer:
    """Follows the TalosMachines in the API server's store and the applies in the Talos history."""

    def __init__(self, env: SimEnvironment, view: View) -> None:
        self.env = env
        self.view = view
        self.rows = {m.name: Row(m.name, m.role, env.node(m.name).name) for m in env.machines}
        self._by_node = {r.node: r for r in self.rows.values()}
        self._changed = anyio.Event()  # set on every change seen; `until` re-checks then

    def attach(self) -> None:
        self.env.management.store.listeners.append(self._on_change)
        self.env.talos.history.listeners.append(self._on_event)

    def detach(self) -> None:
        if self._on_change in self.env.management.store.listeners:
            self.env.management.store.listeners.remove(self._on_change)
        if self._on_event in self.env.talos.history.listeners:
            self.env.talos.history.listeners.remove(self._on_event)

    def _on_change(self, change: Change, rt: ResourceType) -> None:
        if rt.plural != "talosmachines" or change.namespace != self.env.namespace:
            return
        row = self.rows.get(change.new["metadata"]["name"])
        if row is None:
            return
        status = change.new.get("status") or {}
        self._changed.set()
        row.config_hash = str(status.get("configHash") or "")
        row.reboot_paths = list(status.get("rebootPaths") or [])
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is None or (ready.get("status"), ready.get("reason")) == (row.ready, row.reason):
            return
        row.ready, row.reason, row.message = str(ready["status"]), str(ready["reason"]), str(ready.get("message", ""))
        self.view.transition(row)

    def _on_event(self, event: dict[str, Any]) -> None:
        row = self._by_node.get(str(event.get("node")))
        if event.get("kind") != "apply" or row is None:
            return
        row.applies.append((str(event["config_hash"]), str(event["mode"])))
        row.running = row.applies[-1][0]
        self._changed.set()
        self.view.applied(row)

    async def until(self, pred: Callable[[Row], bool], within: float, what: str) -> None:
        """Wait until ``pred`` holds for every machine; DemoFailed naming the ones it does not hold for."""
        with anyio.move_on_after(within):
            while True:
                self._changed = anyio.Event()
                if all(pred(r) for r in self.rows.values()):
                    return
                await self._changed.wait()
        late = [r for r in self.rows.values() if not pred(r)]
        if not late:  # it came true just as the time ran out
            return
        names = ", ".join(f"{r.name} ({r.reason})" for r in late)
        said = f"; {late[0].name} says: {late[0].message}" if late[0].message else ""
        raise DemoFailed(f"{what} did not happen within {within:g} s; still waiting for: {names}{said}")


# ---- how it is shown ------------------------------------------------------------------------


class View:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.rows: list[Row] = []

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.t0:6.2f}s]"

    def say(self, text: str) -> None:
        self.write(text + "\n")

    def write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            # The reader went away (`| head`): finish silently; stdout now points at /dev/null so that
            # the interpreter's own flush at exit does not fail either.
            self.out = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
            os.dup2(self.out.fileno(), sys.stdout.fileno())

    def transition(self, row: Row) -> None: ...

    def applied(self, row: Row) -> None: ...

    def refresh(self) -> None: ...

    def freeze(self) -> None: ...

    def close(self) -> None: ...


class Lines(View):
    """Without a terminal: one line per transition, nothing redrawn."""

    def transition(self, row: Row) -> None:
        extra = f"  rebootPaths: {', '.join(row.reboot_paths)}" if row.reason == "RebootRequired" else ""
        self.say(f"{self.stamp()}   {row.name:<16} {row.role:<13} Ready={row.ready:<7} {row.reason}{extra}")

    def applied(self, row: Row) -> None:
        config, mode = row.applies[-1]
        self.say(f"{self.stamp()}   {row.name:<16} {row.role:<13} apply #{len(row.applies)} {mode}, "
                 f"config {config[:12]}")


_COLOURS = {"True": "\x1b[32m", "False": "\x1b[31m", "Unknown": "\x1b[33m"}


class LiveTable(View):
    """With a terminal: step lines scroll, the machines' table below them is redrawn in place."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(out)
        self._drawn = 0
        self._dirty = False
        self._live = True  # False once frozen: the table stays where it is, lines follow below it
        self.write("\x1b[?25l")  # hide the cursor while redrawing

    def say(self, text: str) -> None:
        self._erase()
        super().say(text)
        self._draw()

    def transition(self, row: Row) -> None:
        self._dirty = True

    def applied(self, row: Row) -> None:
        self._dirty = True

    def refresh(self) -> None:
        if self._dirty and self._live:
            self._erase()
            self._draw()

    def freeze(self) -> None:
        self.refresh()
        self._live, self._drawn = False, 0

    def close(self) -> None:
        self.freeze()
        self.write("\x1b[?25h")

    def _erase(self) -> None:
        if self._drawn:
            self.write(f"\x1b[{self._drawn}A\x1b[J")
            self._drawn = 0

    def _draw(self) -> None:
        if not self.rows or not self._live:
            return
        width = max(len(r.name) for r in self.rows)
        cells = [("MACHINE".ljust(width), "ROLE        ", "READY  ", "REASON          ", "APPLIES", "RUNNING")]
        cells += [(r.name.ljust(width), r.role.ljust(12), r.ready.ljust(7), r.reason.ljust(16),
                   str(len(r.applies)).ljust(7), r.running[:12]) for r in self.rows]
        # A wrapped line would break the erase count: never write past the terminal's width.
        columns = shutil.get_terminal_size().columns - 1
        lines = []
        for name, role, ready, reason, applies, running in cells:
            plain = f"  {name} {role} {ready} {reason} {applies} {running}"[:columns]
            colour = _COLOURS.get(ready.strip())
            lines.append(plain.replace(f" {ready} ", f" {colour}{ready}\x1b[0m ", 1) if colour else plain)
        self.write("".join(line + "\n" for line in lines))
        self._drawn, self._dirty = len(lines), False


# ---- the demo -------------------------------------------------------------------------------


class Demo:
    def __init__(self, args: argparse.Namespace, contract: VersionContract, bundle: SecretsBundle | None,
                 log_path: Path, view: View) -> None:
        self.args = args
        self.contract = contract
        self.bundle = bundle
        self.log_path = log_path
        self.view = view
        self.timing = Timing().scaled(args.time_scale)
        self._stopping = False

    def step(self, n: str, text: str) -> None:
        self.view.say(f"{self.view.stamp()} {n} {text}")

    def ok(self, text: str) -> None:
        self.view.say(f"{self.view.stamp()}   ok: {text}")

    async def main(self) -> int:
        from ichord.sim.combined import SimEnvironment  # noqa: PLC0415 - keeps `ichord --help` light

        a = self.args
        self.view.say(f"ichord demo: {a.control_planes} control plane(s) + {a.workers} worker(s), Talos "
                      f"{self.contract}, every duration x{a.time_scale:g}")
        env = SimEnvironment(control_planes=a.control_planes, workers=a.workers, contract=self.contract,
                             bundle=self.bundle, time_scale=a.time_scale)
        try:
            with anyio.fail_after(a.timeout):
                await env.start()
            return await self._with_env(env)
        except TimeoutError:
            return self._failed(f"the simulators did not start within {a.timeout:g} s")
        finally:
            with anyio.CancelScope(shield=True):
                await env.stop()
            self.view.close()

    async def _with_env(self, env: SimEnvironment) -> int:
        from ichord.daemon import Daemon, DaemonSettings, make_client  # noqa: PLC0415

        bundle = env.bundle
        assert bundle is not None  # start() generated one when none was given
        self.view.say(f"bundle: fingerprint {bundle_fingerprint(bundle)[:16]}, in the Secret "
                      f"{env.namespace}/{env.secret_name} (its keys are never printed)")
        ips = [m.ip for m in env.machines]
        self.view.say(f"simulators up in {env.started_in:.2f}s: Kubernetes API {env.kube.url}, Talos apid on "
                      f"{ips[0]}..{ips[-1]}, objects: TalosCluster {env.cluster_name} + "
                      f"{len(ips)} TalosMachines in {env.namespace}")
        initial = _rendered(env, bundle, [])
        by_role = {m.role: initial[m.name][:12] for m in env.machines}
        self.view.say("each node runs ichord's render of those objects: "
                      + ", ".join(f"{role} config {h}" for role, h in by_role.items()))
        self.view.say(f"daemon: `ichord run` in this process, log ({self.args.log_level}, JSON) in {self.log_path}")
        observer = Observer(env, self.view)
        for row in observer.rows.values():
            row.running = initial[row.name]
        self.view.rows = list(observer.rows.values())
        settings = DaemonSettings(kubeconfig=str(env.kubeconfig), namespace=env.namespace, identity="ichord-demo",
                                  metrics_host="127.0.0.1", metrics_port=0, timing=self.timing)
        failure: list[str] = []
        before = Counter(env.management.requests.counts())
        t0 = time.monotonic()
        with self.log_path.open("a", encoding="utf-8") as log_file:
            _log_to(log_file, self.args.log_level)
            observer.attach()
            kube = client = None
            try:
                kube = await make_client(settings)
                client = await make_client(replace(settings, timing=Timing()))  # the demo's own: unscaled
                async with anyio.create_task_group() as tg:
                    script = anyio.CancelScope()
                    tg.start_soon(self._run_daemon, Daemon(settings, kube), failure, script)
                    tg.start_soon(self._refresh)
                    with script:
                        try:
                            await self._script(env, bundle, observer, client, initial)
                        except DemoFailed as exc:
                            failure.append(str(exc))
                        except IchordError as exc:  # the demo's own request to the API server failed
                            failure.append(f"the demo could not patch the TalosCluster: {exc}")
                    requests = Counter(env.management.requests.counts()) - before
                    watches = int(env.management.open_watches)
                    elapsed = time.monotonic() - t0
                    self._stopping = True
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    for c in (client, kube):
                        if c is not None:
                            await c.close()
                observer.detach()
                logging.getLogger().handlers.clear()
        self.view.freeze()
        if failure:
            return self._failed(failure[0])
        self._summary(observer, requests, watches, elapsed)
        return 0

    async def _run_daemon(self, daemon: Daemon, failure: list[str], script: anyio.CancelScope) -> None:
        try:
            await daemon.run()
            if not self._stopping:
                failure.append("interrupted: the daemon stopped on SIGINT or SIGTERM before the demo finished")
        except Exception as exc:
            logging.getLogger("ichord.demo").exception("the daemon crashed")
            while isinstance(exc, ExceptionGroup) and exc.exceptions:
                exc = exc.exceptions[0]  # the task group's wrapping says nothing: name what was raised
            failure.append(f"the daemon stopped on {type(exc).__name__}: {SCRUBBER.text(str(exc))[:300]} (the log "
                           "has the traceback; a busy machine may need a larger --time-scale)")
        finally:
            script.cancel()

    async def _refresh(self) -> None:
        while True:
            self.view.refresh()
            await anyio.sleep(0.1)

    async def _script(self, env: SimEnvironment, bundle: SecretsBundle, obs: Observer, client: KubeClient,
                      initial: dict[str, str]) -> None:
        t, n = self.args.timeout, len(obs.rows)
        self.step("1/4", "converge: the daemon reads every node's running configuration and compares it with "
                  "its render")
        await obs.until(lambda r: r.reason == "Converged" and r.config_hash == initial[r.name], t,
                        "every machine Ready=True/Converged")
        _expect_applies(obs, lambda _r: [], "before any change")
        self.ok(f"{n}/{n} machines Ready=True/Converged, nothing applied (the nodes already run the render)")

        safe = _rendered(env, bundle, [SAFE_PATCH])
        self.step("2/4", "safe patch on the TalosCluster: machine.sysctls net.core.somaxconn=65535")
        await _patch(client, env, [SAFE_PATCH])
        await obs.until(lambda r: bool(r.applies) and r.reason == "Converged" and r.config_hash == safe[r.name],
                        t, "the safe patch applied and every machine Converged again")
        _expect_applies(obs, lambda r: [(safe[r.name], "NO_REBOOT")], "after the safe patch")
        self.ok(f"{n}/{n} nodes took exactly one apply (NO_REBOOT) of their new render and run it")

        self.step("3/4", "reboot-requiring patch: KernelModuleConfig br_netfilter (a kernel module loads at boot)")
        await _patch(client, env, [SAFE_PATCH, REBOOT_PATCH])
        await obs.until(lambda r: r.ready == "False" and r.reason == "RebootRequired" and bool(r.reboot_paths), t,
                        "every machine reporting Ready=False/RebootRequired with its rebootPaths")
        _expect_applies(obs, lambda r: [(safe[r.name], "NO_REBOOT")], "after the reboot-requiring patch")
        first = next(iter(obs.rows.values()))
        self.ok(f"reported on {n}/{n} machines, applied on none; rebootPaths: {', '.join(first.reboot_paths)}")
        self.view.say(f"      {first.name} says: {first.message}")

        self.step("4/4", "remove the reboot-requiring patch")
        await _patch(client, env, [SAFE_PATCH])
        await obs.until(lambda r: r.reason == "Converged" and r.config_hash == safe[r.name], t,
                        "every machine Converged again")
        _expect_applies(obs, lambda r: [(safe[r.name], "NO_REBOOT")], "after removing the patch")
        self.ok(f"{n}/{n} machines Converged again, nothing applied")

    def _summary(self, obs: Observer, requests: Counter[tuple[str, int]], watches: int, elapsed: float) -> None:
        say = self.view.say
        say("summary:")
        for r in obs.rows.values():
            modes = ", ".join(sorted({m for _h, m in r.applies}))
            say(f"  {r.name:<16} {r.role:<13} {len(r.applies)} apply, config {r.applies[-1][0][:12]} ({modes})"
                if r.applies else f"  {r.name:<16} {r.role:<13} no apply")
        verbs: Counter[str] = Counter()
        for (verb, _status), count in requests.items():
            verbs[verb] += count
        errors = ", ".join(f"{c} {v} {s}" for (v, s), c in sorted(requests.items()) if s >= 400) or "none"
        say(f"  Kubernetes API requests in {elapsed:.1f}s: {sum(verbs.values())} ("
            + ", ".join(f"{v} {c}" for v, c in verbs.most_common())
            + f") and {watches} watches open; 3 are the demo's own patches; answered 4xx/5xx: {errors}")
        say(f"  daemon log: {self.log_path}")
        say("demo: done, everything shown happened")

    def _failed(self, reason: str) -> int:
        self.view.freeze()
        self.view.say(f"FAILED: {reason}")
        if self.log_path.exists():
            self.view.say(f"  daemon log: {self.log_path}")
        return 1


def _rendered(env: SimEnvironment, bundle: SecretsBundle, patches: list[str]) -> dict[str, str]:
    """Machine -> the hash of what ichord renders for it with these cluster patches."""
    cluster = replace(env.cluster_inputs(), patches=tuple(patches))
    return {m: render(bundle, cluster, env.machine_inputs(m)).hash() for m in env.machine_names}


async def _patch(client: KubeClient, env: SimEnvironment, patches: list[str]) -> None:
    await crds.clusters(client).patch(env.namespace, env.cluster_name, {"spec": {"patches": patches}})


def _expect_applies(obs: Observer, expected: Callable[[Row], list[tuple[str, str]]], when: str) -> None:
    for r in obs.rows.values():
        want = expected(r)
        if r.applies != want:
            seen = ", ".join(f"{m} {h[:12]}" for h, m in r.applies) or "none"
            wanted = ", ".join(f"{m} {h[:12]}" for h, m in want) or "none"
            raise DemoFailed(f"{r.name}: expected the applies {wanted} {when}, the node accepted: {seen}")


def _log_to(stream: TextIO, level: str) -> None:
    from ichord import log  # noqa: PLC0415

    log.configure(level, json=True, stream=stream)

