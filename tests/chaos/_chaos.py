"""The chaos tier's machinery (issue 19), shared by every operation's chaos test.

- ``Chaos``: a seeded driver that injects, at random moments and for random spans of the daemon's time, what
  production does to the daemon: API errors (409 on writes, 429, 500, 503) and connection resets (before or
  after the request was served) on a verb of the management or the managed API; a 30-90 s outage of the
  management API; watches dropped after compaction (the informers' next watch is 410 Gone); Talos nodes that
  stop answering (Unavailable), that stop answering in the middle of an apply (it took effect, its answer is
  lost), that apply slowly or refuse applies for a while; and SIGKILL of the daemon, restarted at once.
- ``sigkill_at_random``: the kill loop (a daemon SIGKILLed at a random moment, K times, then one left to finish);
  ``kill_at_each_failpoint``: a daemon per failpoint, each killed there in turn.
- ``operator``: the operator's part (the ca-rotation's credentials hand-off), played on the simulator's store so
  that it is not subject to the faults the driver injects.
- ``common_invariants``: the invariants of docs/decisions.md#invariants every operation shares, read from the
simulators;
  ``SecretHistory``: the bundle Secret's writes ordered against the nodes' applies (docs/decisions.md#invariants 1).
"""

from __future__ import annotations

import itertools
import json
import random
import signal
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ichord.api import names
from ichord.kube.nodes import CORDONED_BY_ICHORD_ANNOTATION
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube import KubeSimulator
from ichord.sim.kube.status import ApiError
from tests.e2e._daemon import DAEMON_TIME_SCALE, Daemon, eventually

SCALE = float(DAEMON_TIME_SCALE)
VERBS = ("get", "list", "watch", "create", "update", "patch")
OPERATIONS = ("ichor.maesh.dev", "v1alpha1", "talosoperations")


@dataclass
class Chaos:
    env: SimEnvironment
    rng: random.Random
    workdir: Path
    daemons: list[Daemon] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)

    def start_daemon(self) -> Daemon:
        daemon = Daemon(self.env, self.workdir, f"chaos-{len(self.daemons)}")
        self.daemons.append(daemon)
        return daemon

    @property
    def daemon(self) -> Daemon:
        return self.daemons[-1]

    def span(self, low: float, high: float) -> float:
        """A fault's duration: ``low``..``high`` seconds of the daemon's time (its Timing is scaled)."""
        return self.rng.uniform(low, high) * SCALE

    # ---- the faults ---------------------------------------------------------------------------

    async def api_errors(self, sim: KubeSimulator, label: str, codes: tuple[int, ...]) -> None:
        verb, code = self.rng.choice(VERBS), self.rng.choice(codes)
        if code == 409 and verb not in ("update", "patch"):
            verb = "patch"  # a Conflict answers a write
        rate = self.rng.uniform(0.2, 0.6)
        self.injected.append(f"{label} {verb} {code} x{rate:.1f}")
        sim.faults.error_code = code
        sim.faults.error_rate = {verb: rate}
        await anyio.sleep(self.span(10, 60))
        sim.faults.error_rate = {}

    async def connection_resets(self, sim: KubeSimulator, label: str) -> None:
        verb, after = self.rng.choice(VERBS), self.rng.random() < 0.5
        rate = self.rng.uniform(0.2, 0.6)
        self.injected.append(f"{label} {verb} reset{' after serving' if after else ''} x{rate:.1f}")
        sim.faults.reset_after = after
        sim.faults.reset_rate = {verb: rate}
        await anyio.sleep(self.span(10, 60))
        sim.faults.reset_rate = {}

    async def management_outage(self) -> None:
        self.injected.append("management outage")
        async with self.env.management.outage():
            await anyio.sleep(self.span(30, 90))

    async def watches_expired(self) -> None:
        self.injected.append("watches dropped after compaction (410)")
        self.env.management.compact()
        self.env.management.drop_watches()
        await anyio.sleep(self.span(5, 20))

    async def node_unreachable(self) -> None:
        machine = self.rng.choice(self.env.machine_names)
        self.injected.append(f"{machine} unreachable")
        await self.env.set_unreachable(machine, True)
        try:
            await anyio.sleep(self.span(10, 60))
        finally:
            await self.env.set_unreachable(machine, False)

    async def vanishes_mid_apply(self) -> None:
        machine = self.rng.choice(self.env.machine_names)
        node = self.env.node(machine)
        self.injected.append(f"{machine} vanishes at its next apply")
        node.faults.vanish_after_apply = True
        await anyio.sleep(self.span(20, 60))
        vanished = not node.faults.vanish_after_apply
        node.faults.vanish_after_apply = False
        if vanished:
            self.injected.append(f"{machine} vanished mid-apply")
            await self.env.set_unreachable(machine, False)

    async def slow_node(self) -> None:
        node = self.env.node(self.rng.choice(self.env.machine_names))
        self.injected.append(f"{node.name} slow")
        node.faults.slow = self.span(5, 30)
        await anyio.sleep(self.span(20, 60))
        node.faults.slow = 0.0

    async def apply_refused(self) -> None:
        node = self.env.node(self.rng.choice(self.env.machine_names))
        self.injected.append(f"{node.name} refuses applies")
        node.faults.apply_error = "chaos: the node refused the configuration for a while"
        await anyio.sleep(self.span(10, 40))
        node.faults.apply_error = None

    async def kill(self) -> None:
        self.injected.append("SIGKILL")
        if self.daemon.proc.poll() is None:
            self.daemon.proc.send_signal(signal.SIGKILL)
        await self.daemon.stop()
        self.start_daemon()

    async def one(self) -> None:
        faults: list[Callable[[], Awaitable[None]]] = [
            lambda: self.api_errors(self.env.management, "management", (409, 429, 500, 503)),
            lambda: self.api_errors(self.env.kube, "managed", (429, 500, 503)),
            lambda: self.connection_resets(self.env.management, "management"),
            lambda: self.connection_resets(self.env.kube, "managed"),
            self.management_outage, self.watches_expired, self.node_unreachable, self.vanishes_mid_apply,
            self.slow_node, self.apply_refused, self.kill,
        ]
        await self.rng.choice(faults)()

    async def lift_all(self) -> None:
        for sim in (self.env.management, self.env.kube):
            sim.faults.error_rate, sim.faults.reset_rate = {}, {}
        for name in self.env.machine_names:
            node = self.env.node(name)
            node.faults.slow, node.faults.apply_error, node.faults.vanish_after_apply = 0.0, None, False
            if node.faults.unreachable:
                await self.env.set_unreachable(name, False)

    async def stop_all(self, seed: int) -> None:
        for daemon in self.daemons:
            code = await daemon.stop()
            # 0: stopped; SIGKILLed; 1 only after losing leadership (run_cli: one JSON line, then exit 1); -15 only for
            # a daemon the restart policy had just started and that never served its port (SIGTERM before its
            # handler: what a pod terminated while starting gets).
            assert code in (0, -9, 137) or (code == 1 and "leadership lost" in daemon.log()) or (
                code == -15 and daemon.port is None), (seed, code)


async def inject_until(chaos: Chaos, finished: Callable[[], Awaitable[dict[str, Any]]],
                       within: float) -> dict[str, Any]:
    """Inject faults one after another and restart a daemon that exited, until ``finished`` returns."""
    done = anyio.Event()
    result: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        async def inject() -> None:
            while not done.is_set():
                await anyio.sleep(chaos.rng.uniform(0.2, 1.5))
                if not done.is_set():
                    await chaos.one()

        async def restart_policy() -> None:
            # The Deployment's part: a daemon that exited (leadership lost in an outage: exit 1) is restarted.
            while not done.is_set():
                if chaos.daemon.proc.poll() is not None:
                    chaos.injected.append(f"exited {chaos.daemon.proc.returncode}, restarted")
                    chaos.start_daemon()
                await anyio.sleep(0.1)

        tg.start_soon(inject)
        tg.start_soon(restart_policy)
        with anyio.fail_after(within):
            result = await finished()
        done.set()
        tg.cancel_scope.cancel()  # a fault under way is cut short; lift_all clears what it left
    return result


async def sigkill_at_random(env: SimEnvironment, workdir: Path, rng: random.Random, kills: int,
                            follow: Callable[[], Awaitable[dict[str, Any]]]) -> list[Daemon]:
    """Start a daemon, let it work ``0.5..4 s``, SIGKILL it (no cleanup, no Lease release); ``kills`` times or
    until the operation ended. Returns the killed daemons (their logs are checked afterwards)."""
    daemons: list[Daemon] = []
    for i in range(kills):
        daemon = Daemon(env, workdir, f"rand-{i}")
        daemons.append(daemon)
        with anyio.move_on_after(rng.uniform(0.5, 4.0)):
            op = await follow()
            if (op.get("status") or {}).get("phase") == "Completed":
                break
        if daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGKILL)
        await daemon.stop()
    return daemons


async def kill_at_each_failpoint(env: SimEnvironment, workdir: Path, points: Iterable[str],
                                 follow: Callable[[Daemon], Awaitable[object]]) -> list[Daemon]:
    """For each failpoint in turn, a daemon armed with it (``ICHORD_FAILPOINTS``) that must reach it and exit 137;
    ``follow(daemon)`` plays the operator until that daemon is gone. Returns the daemons (their logs are checked
    afterwards); the caller starts the one that finishes."""
    daemons: list[Daemon] = []
    for i, point in enumerate(points):
        daemon = Daemon(env, workdir, f"fp-{i}", extra_env={"ICHORD_FAILPOINTS": point})
        daemons.append(daemon)
        with anyio.fail_after(120):
            await follow(daemon)
        assert await daemon.stop() == 137, (point, daemon.log()[-3000:])
        assert f"failpoint {point} reached" in daemon.log(), point
    return daemons


def operation(env: SimEnvironment, name: str) -> dict[str, Any]:
    store = env.management.store
    return store.get(store.resolve(*OPERATIONS), env.namespace, name)


async def operator(env: SimEnvironment, name: str, seen: list[str]) -> dict[str, Any]:
    """The operator, on the simulator's store (never through the faulted API): note the stages, acknowledge
    the credentials hand-off; return the operation once it is Completed or Failed."""
    store = env.management.store
    rt = store.resolve(*OPERATIONS)
    while True:
        op = operation(env, name)
        status = op.get("status") or {}
        stage = (status.get("caRotation") or {}).get("stage") or status.get("phase")
        if stage and (not seen or seen[-1] != stage):
            seen.append(stage)
        if stage == "AwaitingCredentials":
            token = handoff_token(status["caRotation"]["certificates"])
            if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                store.patch(rt, env.namespace, name, "application/merge-patch+json", {"metadata": {
                    "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        if status.get("phase") in ("Completed", "Failed"):
            return op
        await anyio.sleep(0.02)


# ---- the invariants every operation shares ------------------------------------------------------------


def cordoned(env: SimEnvironment) -> list[str]:
    """Nodes left unschedulable or carrying ichord's cordon annotation."""
    store = env.kube.store
    return [n["metadata"]["name"] for n in store.list(store.resolve("", "v1", "nodes"), None)[0]
            if (n.get("spec") or {}).get("unschedulable")
            or CORDONED_BY_ICHORD_ANNOTATION in (n["metadata"].get("annotations") or {})]


def key_lines(bundles: Iterable[SecretsBundle]) -> set[str]:
    """A line from the middle of every private key of the bundles (what a leak would show)."""
    out = set()
    for b in bundles:
        for ca in (b.os, b.k8s, b.etcd, b.k8s_aggregator):
            if ca is not None and ca.key_pem:
                out.add(ca.key_pem.decode().splitlines()[1])
    return out


def leaks(text: str, secrets: set[str]) -> list[str]:
    found = [s[:12] + "..." for s in secrets if s in text]
    return found + (["a PRIVATE KEY block"] if "PRIVATE KEY" in text else [])


def published(env: SimEnvironment) -> str:
    """Every status of ichord's objects and every Event on the management API, as text."""
    store = env.management.store
    parts = []
    for group, version, plural in (OPERATIONS, ("ichor.maesh.dev", "v1alpha1", "talosclusters"),
                                   ("ichor.maesh.dev", "v1alpha1", "talosmachines")):
        for obj in store.list(store.resolve(group, version, plural), env.namespace)[0]:
            parts.append(json.dumps(obj.get("status") or {}))
    for resource in (("", "v1", "events"), ("events.k8s.io", "v1", "events")):
        try:
            rt = store.resolve(*resource)
        except ApiError:  # a simulator without that API
            continue
        parts += [json.dumps(e) for e in store.list(rt, None)[0]]
    return "\n".join(parts)


def lock_released(env: SimEnvironment, name: str) -> bool:
    """The cluster's lock Lease free or gone, and the operation's finalizer removed."""
    store = env.management.store
    leases = store.list(store.resolve("coordination.k8s.io", "v1", "leases"), env.namespace)[0]
    lock = f"{names.CLUSTER_LOCK_PREFIX}{env.cluster_name}"
    held = [lease for lease in leases if lease["metadata"]["name"] == lock
            and (lease.get("spec") or {}).get("holderIdentity")]
    return not held and not operation(env, name)["metadata"].get("finalizers")


def secret_keys(env: SimEnvironment) -> set[str]:
    store = env.management.store
    return set(store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)["data"])


async def common_invariants(env: SimEnvironment, name: str, daemons: list[Daemon],
                            bundles: Iterable[SecretsBundle]) -> None:
    """Completed, no temporary state left (rotation.yaml, the lock, the finalizer, cordons), no key material in
    any daemon's log, any status or Event."""
    assert operation(env, name)["status"]["phase"] == "Completed"
    assert secret_keys(env) == {names.SECRETS_KEY}, secret_keys(env)  # no rotation.yaml
    assert cordoned(env) == []
    # Completed may be written by a daemon killed before it let go: the next one does.
    await eventually(lambda: lock_released(env, name), within=60, what="the lock released, the finalizer removed")
    secrets = key_lines(bundles)
    for d in daemons:
        assert leaks(d.log(), secrets) == [], d.name
    assert leaks(published(env), secrets) == []


@dataclass
class SecretHistory:
    """Every change of the bundle Secret, stamped with the Talos history's length at that moment (both simulators
    run on one event loop, so this orders the Secret's writes against the nodes' applies exactly)."""

    env: SimEnvironment
    changes: list[tuple[int, bool, str]] = field(default_factory=list)  # (talos seq, rotation.yaml?, secrets.yaml)

    def __post_init__(self) -> None:
        store = self.env.management.store
        self._record(store.get(store.resolve("", "v1", "secrets"), self.env.namespace, self.env.secret_name))
        store.listeners.append(self._on_change)

    def _on_change(self, change: Any, rt: Any) -> None:
        obj = change.new
        if (rt.plural == "secrets" and obj["metadata"]["name"] == self.env.secret_name
                and obj["metadata"].get("namespace") == self.env.namespace):
            self._record(obj)

    def _record(self, obj: dict[str, Any]) -> None:
        data = obj.get("data") or {}
        self.changes.append((len(self.env.talos.history.events), names.ROTATION_KEY in data,
                             str(data.get(names.SECRETS_KEY))))

    def violations(self, since: int, *, rotation: bool) -> list[str]:
        """docs/decisions.md#invariants (1): rotation.yaml written before any node is told anything; secrets.yaml
        replaced once (a rotation) or never (any other operation)."""
        out = []
        values = [v for _, _, v in self.changes]
        replaced = sum(1 for a, b in itertools.pairwise(values) if a != b)
        if replaced != int(rotation):
            out.append(f"secrets.yaml replaced {replaced} times")
        if rotation:
            applies = [e["seq"] for e in self.env.talos.history.since(since) if e["kind"] == "apply"]
            first = next((seq for seq, has, _ in self.changes if has), None)
            if first is None:
                out.append("rotation.yaml never written")
            elif applies and first >= applies[0]:  # the stamp is the seq of the last event before it
                out.append(f"rotation.yaml written after the first apply (#{applies[0]})")
        return out


def on_new_talos_and_kubernetes_cas(env: SimEnvironment, new: SecretsBundle) -> None:
    """Every node signs with and trusts only ``new``'s Talos and Kubernetes CAs (the node's own view)."""
    short = {"os": ca_fingerprint(new.os)[:16], "kubernetes": ca_fingerprint(new.k8s)[:16]}
    for m in env.machine_names:
        cas = env.node(m).state()["cas"]
        assert cas["os"]["issuing"] == short["os"] and cas["os"]["trusted"] == [short["os"]], (m, cas["os"])
        assert cas["kubernetes"]["trusted"] == [short["kubernetes"]], (m, cas["kubernetes"])
        if cas["kubernetes"]["issuing"] is not None:
            assert cas["kubernetes"]["issuing"] == short["kubernetes"], (m, cas["kubernetes"])
